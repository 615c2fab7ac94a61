// The extension module vllm_rl._C.  Each component in csrc/ provides a bind_* function;
// this file is the only PYBIND11_MODULE (all csrc/*.cc are linked into one module).
#include <pybind11/pybind11.h>

namespace vllm_rl {
void bind_suffix_tree(pybind11::module_& m);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "C++ components of vllm_rl (the DAS suffix tree).";
  vllm_rl::bind_suffix_tree(m);
}
