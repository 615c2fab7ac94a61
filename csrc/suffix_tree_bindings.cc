// Python bindings of the DAS suffix tree (suffix_tree.h).  Every call that does real work
// converts its arguments with the GIL held, then releases the GIL for the C++ part
// (py::call_guard, or a py::gil_scoped_release scope where a context is converted first);
// results are converted back after the GIL is taken again.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "suffix_tree.h"

namespace py = pybind11;

namespace vllm_rl {
namespace {

using ReleaseGil = py::call_guard<py::gil_scoped_release>;
using Contexts = std::vector<std::vector<Token>>;

// The last `keep` token ids of a Python sequence.  Only the last max_depth tokens of a
// context can matter, so a long context costs O(max_depth) to convert: lists and tuples
// are read in place, other sequences (e.g. numpy arrays) go through pybind11's generic
// conversion first.  Needs the GIL.
std::vector<Token> tail_of(py::handle seq, size_t keep) {
  try {
    if (PyList_Check(seq.ptr()) || PyTuple_Check(seq.ptr())) {
      const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
      PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
      std::vector<Token> out;
      out.reserve(std::min(n, keep));
      for (size_t i = n > keep ? n - keep : 0; i < n; ++i)
        out.push_back(py::cast<Token>(py::handle(items[i])));
      return out;
    }
    auto all = py::cast<std::vector<Token>>(seq);
    if (all.size() > keep) all.erase(all.begin(), all.end() - static_cast<ptrdiff_t>(keep));
    return all;
  } catch (const py::cast_error&) {
    throw py::type_error("a context must be a sequence of int32 token ids");
  }
}

Contexts tails_of(py::handle seqs, const std::vector<size_t>& keep) {
  Contexts out;
  size_t i = 0;
  for (py::handle seq : py::reinterpret_borrow<py::iterable>(seqs)) {
    out.push_back(tail_of(seq, keep[keep.size() == 1 ? 0 : std::min(i, keep.size() - 1)]));
    ++i;
  }
  return out;
}

std::vector<std::vector<Token>> tokens_of(std::vector<Draft>&& drafts) {
  std::vector<std::vector<Token>> out;
  out.reserve(drafts.size());
  for (Draft& d : drafts) out.push_back(std::move(d.tokens));
  return out;
}

constexpr const char* kTreeDoc = R"doc(
Depth-bounded suffix tree over token-id sequences with occurrence counts: the drafter
index of DAS (Sec. 4.1.2).  Sequences are named by integer ids; a growing rollout is
appended with ``extend`` and sealed with ``finish``; a finished rollout goes in with
``insert``; ``remove`` drops one (sliding window) and returns its memory exactly.
All methods release the GIL; a reader/writer lock makes concurrent use safe.
)doc";

constexpr const char* kDraftDoc = R"doc(
Draft up to ``max_tokens`` tokens continuing ``context``.

The draft continues the longest suffix of the context (at most ``max(1, max_depth -
max_tokens)`` tokens) found in the tree, following the most frequent child (ties: the
smallest token id) while the cumulative probability, the product of
count(child) / count(parent), stays >= ``min_prob``.  Empty when no suffix matches.
With ``backoff=True``, when that suffix has no continuation in the tree (its only
occurrences end there, e.g. the growing rollout the context comes from), the draft
continues the longest shorter suffix that has one.
)doc";

}  // namespace

void bind_suffix_tree(py::module_& m) {
  py::register_exception<UnknownSequence>(m, "UnknownSequenceError", PyExc_KeyError);

  py::class_<Draft>(m, "Draft", "A draft with its per-token cumulative probabilities.")
      .def_readonly("tokens", &Draft::tokens, "Proposed token ids.")
      .def_readonly("probs", &Draft::probs,
                    "probs[i]: cumulative probability that tokens[:i + 1] all follow.")
      .def_readonly("match_len", &Draft::match_len,
                    "Length of the context suffix the draft continues.")
      .def_readonly("match_count", &Draft::match_count,
                    "Occurrences of that suffix in the stored sequences.")
      .def("__repr__", [](const Draft& d) {
        return "Draft(tokens=" + std::to_string(d.tokens.size()) +
               ", match_len=" + std::to_string(d.match_len) +
               ", match_count=" + std::to_string(d.match_count) + ")";
      });

  py::class_<SuffixTree>(m, "SuffixTree", kTreeDoc)
      .def(py::init<int>(), py::arg("max_depth") = 64,
           "Empty tree; strings are indexed up to ``max_depth`` tokens (1..65535).")
      .def("extend", &SuffixTree::extend, py::arg("seq_id"), py::arg("tokens"), ReleaseGil(),
           "Append tokens to a growing sequence, creating it if new (O(max_depth) per token).")
      .def("insert", &SuffixTree::insert, py::arg("seq_id"), py::arg("tokens"), ReleaseGil(),
           "Add a finished sequence in one call (``extend`` then ``finish``); the id must be new.")
      .def("finish", &SuffixTree::finish, py::arg("seq_id"), ReleaseGil(),
           "Seal a growing sequence: it keeps its strings, drops its append state.")
      .def("remove", &SuffixTree::remove, py::arg("seq_id"), ReleaseGil(),
           "Remove a sequence (growing or finished) and free everything only it used.")
      .def(
          "match",
          [](const SuffixTree& t, const py::sequence& context) {
            std::vector<Token> ctx = tail_of(context, t.max_depth());
            py::gil_scoped_release nogil;
            return t.match(ctx);
          },
          py::arg("context"),
          "(match_len, count): the longest suffix of ``context`` in the tree (at most "
          "max_depth tokens) and its number of occurrences.")
      .def("count", &SuffixTree::count, py::arg("pattern"), ReleaseGil(),
           "Occurrences of ``pattern`` (at most max_depth tokens) in the stored sequences.")
      .def(
          "draft",
          [](const SuffixTree& t, const py::sequence& context, int max_tokens, double min_prob,
             bool backoff) {
            std::vector<Token> ctx = tail_of(context, t.max_depth());
            py::gil_scoped_release nogil;
            return t.draft(ctx, max_tokens, min_prob, backoff).tokens;
          },
          py::arg("context"), py::arg("max_tokens"), py::arg("min_prob") = 0.1,
          py::arg("backoff") = false, kDraftDoc)
      .def(
          "draft_info",
          [](const SuffixTree& t, const py::sequence& context, int max_tokens, double min_prob,
             bool backoff) {
            std::vector<Token> ctx = tail_of(context, t.max_depth());
            py::gil_scoped_release nogil;
            return t.draft(ctx, max_tokens, min_prob, backoff);
          },
          py::arg("context"), py::arg("max_tokens"), py::arg("min_prob") = 0.1,
          py::arg("backoff") = false,
          "Like ``draft``, returning a ``Draft`` (tokens, probs, match_len, match_count).")
      .def(
          "draft_batch",
          [](const SuffixTree& t, const py::sequence& contexts, int max_tokens, double min_prob) {
            Contexts ctxs = tails_of(contexts, {static_cast<size_t>(t.max_depth())});
            py::gil_scoped_release nogil;
            return tokens_of(t.draft_batch(ctxs, {max_tokens}, min_prob));
          },
          py::arg("contexts"), py::arg("max_tokens"), py::arg("min_prob") = 0.1,
          "``draft`` for many contexts under one GIL release; ``max_tokens`` is one budget "
          "or a list with one budget per context.")
      .def(
          "draft_batch",
          [](const SuffixTree& t, const py::sequence& contexts, const std::vector<int>& max_tokens,
             double min_prob) {
            Contexts ctxs = tails_of(contexts, {static_cast<size_t>(t.max_depth())});
            py::gil_scoped_release nogil;
            return tokens_of(t.draft_batch(ctxs, max_tokens, min_prob));
          },
          py::arg("contexts"), py::arg("max_tokens"), py::arg("min_prob") = 0.1)
      .def_property_readonly("max_depth", &SuffixTree::max_depth)
      .def("num_nodes", &SuffixTree::num_nodes, ReleaseGil(),
           "Explicit nodes, the root included (1 for an empty tree).")
      .def("num_tokens", &SuffixTree::num_tokens, ReleaseGil(), "Tokens stored.")
      .def("num_sequences", &SuffixTree::num_sequences, ReleaseGil())
      .def("sequences", &SuffixTree::sequences, ReleaseGil(), "Stored sequence ids, ascending.")
      .def("sequence", &SuffixTree::sequence, py::arg("seq_id"), ReleaseGil(),
           "The tokens of one stored sequence.")
      .def("is_growing", &SuffixTree::is_growing, py::arg("seq_id"), ReleaseGil())
      .def("__contains__", &SuffixTree::contains, py::arg("seq_id"), ReleaseGil())
      .def("memory_bytes", &SuffixTree::memory_bytes, ReleaseGil(),
           "Exact bytes held (allocator block overhead excluded); a function of the stored "
           "sequences only, so it returns to its earlier value when sequences are removed.")
      .def("check_invariants", &SuffixTree::check, ReleaseGil(),
           "Re-verify every invariant from scratch; returns '' or the first violation.")
      .def("__repr__", [](const SuffixTree& t) {
        return "SuffixTree(max_depth=" + std::to_string(t.max_depth()) +
               ", sequences=" + std::to_string(t.num_sequences()) +
               ", tokens=" + std::to_string(t.num_tokens()) +
               ", nodes=" + std::to_string(t.num_nodes()) + ")";
      });

  auto many = [](const std::vector<const SuffixTree*>& trees, const py::sequence& contexts,
                 const std::vector<int>& max_tokens, double min_prob, bool backoff) {
    std::vector<size_t> keep;
    for (const SuffixTree* t : trees) keep.push_back(t ? t->max_depth() : 0);
    if (keep.empty()) keep.push_back(0);
    Contexts ctxs = tails_of(contexts, keep);
    py::gil_scoped_release nogil;
    return tokens_of(draft_many(trees, ctxs, max_tokens, min_prob, backoff));
  };
  m.def(
      "draft_many",
      [many](const std::vector<const SuffixTree*>& trees, const py::sequence& contexts,
             int max_tokens, double min_prob, bool backoff) {
        return many(trees, contexts, {max_tokens}, min_prob, backoff);
      },
      py::arg("trees"), py::arg("contexts"), py::arg("max_tokens"), py::arg("min_prob") = 0.1,
      py::arg("backoff") = false,
      "Draft for contexts[i] from trees[i] (e.g. per-problem trees) under one GIL release.");
  m.def("draft_many", many, py::arg("trees"), py::arg("contexts"), py::arg("max_tokens"),
        py::arg("min_prob") = 0.1, py::arg("backoff") = false);
}

}  // namespace vllm_rl
