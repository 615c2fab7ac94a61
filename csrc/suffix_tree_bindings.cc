// Python bindings of the DAS suffix tree (suffix_tree.h).  Every call that does real work
// converts its arguments with the GIL held, then releases the GIL for the C++ part
// (py::call_guard, or a py::gil_scoped_release scope where a context is converted first);
// results are converted back after the GIL is taken again.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>
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


// ---------------------------------------------------------------------------------------
// The batched drafter step (feed_and_draft): arrays in, arrays out, no Python per row.

// Trees by a small integer index, so that a step names each row's tree in an int32 array
// instead of a list of tree objects.  The table holds a reference to each tree; a batch
// holds the table's lock (shared) while it runs without the GIL, and add/remove take it
// exclusively, so a tree cannot be dropped from under a running batch.
class TreeTable {
 public:
  int32_t add(py::object tree) {
    SuffixTree* ptr = py::cast<SuffixTree*>(tree);
    int32_t idx;
    {
      py::gil_scoped_release nogil;
      std::unique_lock lock(mu_);
      if (free_.empty()) {
        idx = static_cast<int32_t>(ptrs_.size());
        ptrs_.push_back(ptr);
        objs_.emplace_back();
      } else {
        idx = free_.back();
        free_.pop_back();
        ptrs_[idx] = ptr;
      }
      objs_[idx] = std::move(tree);  // moves a pointer: no reference count touched
    }
    return idx;
  }

  void remove(int32_t idx) {
    py::object old;  // released after the lock, with the GIL
    {
      py::gil_scoped_release nogil;
      std::unique_lock lock(mu_);
      if (idx < 0 || static_cast<size_t>(idx) >= ptrs_.size() || !ptrs_[idx])
        throw std::out_of_range("no tree at index " + std::to_string(idx));
      ptrs_[idx] = nullptr;
      old = std::move(objs_[idx]);
      free_.push_back(idx);
    }
  }

  py::object get(int32_t idx) const {
    std::shared_lock lock(mu_);
    if (idx < 0 || static_cast<size_t>(idx) >= ptrs_.size() || !ptrs_[idx])
      throw std::out_of_range("no tree at index " + std::to_string(idx));
    return objs_[idx];
  }

  size_t size() const {
    std::shared_lock lock(mu_);
    return ptrs_.size() - free_.size();
  }

  std::shared_mutex& mutex() const { return mu_; }
  SuffixTree* const* data() const { return ptrs_.data(); }
  size_t slots() const { return ptrs_.size(); }

 private:
  std::vector<SuffixTree*> ptrs_;
  std::vector<py::object> objs_;
  std::vector<int32_t> free_;
  mutable std::shared_mutex mu_;
};

// A typed view of a numpy array: exact dtype, C-contiguous, the given shape (-1: any).
template <class T>
const T* array_of(const py::handle& obj, const char* name, py::ssize_t len,
                  py::array* keep, py::ssize_t cols = -2) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(std::string(name) + " must be a numpy array of " +
                         std::string(py::str(py::dtype::of<T>())));
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<T>()) && !a.dtype().equal(py::dtype::of<T>()))
    throw py::type_error(std::string(name) + " must have dtype " +
                         std::string(py::str(py::dtype::of<T>())) + ", got " +
                         std::string(py::str(a.dtype())));
  const py::ssize_t ndim = cols == -2 ? 1 : 2;
  if (a.ndim() != ndim)
    throw py::value_error(std::string(name) + " must have " + std::to_string(ndim) +
                          " dimension(s)");
  if (len >= 0 && a.shape(0) < len)
    throw py::value_error(std::string(name) + " has " + std::to_string(a.shape(0)) +
                          " rows, needs " + std::to_string(len));
  if (len >= 0 && ndim == 1 && a.shape(0) != len)
    throw py::value_error(std::string(name) + " must have " + std::to_string(len) +
                          " entries, got " + std::to_string(a.shape(0)));
  const py::ssize_t item = static_cast<py::ssize_t>(sizeof(T));
  if (a.size() && ((a.shape(ndim - 1) > 1 && a.strides(ndim - 1) != item) ||
                   (ndim == 2 && a.strides(0) % item != 0)))
    throw py::value_error(std::string(name) + " must be contiguous along its last axis");
  *keep = a;
  return static_cast<const T*>(a.data());
}

// The trees of a batched call: a TreeTable (the caller holds its lock while the batch
// runs) or a list of trees (None: no tree), kept alive for the call.
struct TreeList {
  TreeTable* table = nullptr;
  std::vector<py::object> held;
  std::vector<SuffixTree*> listed;

  explicit TreeList(const py::object& trees) {
    if (py::isinstance<TreeTable>(trees)) {
      table = py::cast<TreeTable*>(trees);
      return;
    }
    for (py::handle t : py::reinterpret_borrow<py::iterable>(trees)) {
      held.push_back(py::reinterpret_borrow<py::object>(t));
      listed.push_back(t.is_none() ? nullptr : py::cast<SuffixTree*>(t));
    }
  }
  SuffixTree* const* data() const { return table ? table->data() : listed.data(); }
  size_t count() const { return table ? table->slots() : listed.size(); }
};

constexpr const char* kFeedAndDraftDoc = R"doc(
One DAS drafter step for many rows in one call without the GIL (DAS Sec. 4.1.2: the
per-problem trees grow online and are drafted from at every step).

Row ``i`` belongs to ``trees[tree_idx[i]]`` (``trees``: a ``TreeTable`` or a list of
trees; a negative index skips the row).  First every row appends its new tokens,
``tokens[offsets[i]:offsets[i + 1]]`` (only the first ``feed[i]`` of them if ``feed`` is
given), to its growing sequence ``seq_ids[i]``; then every row with ``max_tokens[i] >
0`` drafts, as ``SuffixTree.draft(context, max_tokens[i], min_prob[i], backoff)`` would,
from the context ``contexts[i, :context_len[i]]``.  Each draft sees every row's feed.

Arrays (numpy, exact dtypes): ``tree_idx``, ``feed``, ``context_len``, ``max_tokens``
int32; ``seq_ids``, ``offsets`` (rows + 1 entries) int64; ``tokens`` int32;
``contexts`` int32, two dimensions, at least ``rows`` rows; ``min_prob`` float64.
Returns ``(drafts, lengths, feed_ns, draft_ns)``: the drafts as an int32 array of
``rows x width`` (``width``: the largest budget, within the trees' depth), row ``i``'s
draft is ``drafts[i, :lengths[i]]``; the CPU time of the two phases (this thread's).  Bad arrays raise
``TypeError`` (dtype) or ``ValueError`` (shape, values: the row is named) before any
tree changes.
)doc";

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
      .def(py::init<int, double>(), py::arg("max_depth") = 64, py::arg("prior") = 0.0,
           "Empty tree; strings are indexed up to ``max_depth`` tokens (1..65535).  A draft's "
           "probabilities add ``prior`` (λ) to each count they divide by: count / (total + λ).")
      .def_property_readonly("prior", &SuffixTree::prior)
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
          "_draft_info_from_rollout",
          [](const SuffixTree& t, SeqId seq_id, const py::sequence& context, int max_tokens,
             double min_prob) -> py::object {
            std::vector<Token> ctx = tail_of(context, t.max_depth());
            Draft d;
            bool ok;
            {
              py::gil_scoped_release nogil;
              ok = t.draft_from_rollout(seq_id, ctx, max_tokens, min_prob, &d);
            }
            return ok ? py::cast(std::move(d)) : py::none();
          },
          py::arg("seq_id"), py::arg("context"), py::arg("max_tokens"), py::arg("min_prob"),
          "For tests: ``draft_info(context, max_tokens, min_prob, backoff=True)`` computed as "
          "``feed_and_draft`` does for a row of the growing sequence ``seq_id`` (from its "
          "append state), or None where that path falls back to the walk from the root.")
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

  py::class_<TreeTable>(m, "TreeTable",
                        "Trees by int index for ``feed_and_draft``: holds a reference to "
                        "each; an index is reused after ``remove``.")
      .def(py::init<>())
      .def("add", &TreeTable::add, py::arg("tree"), "Register a tree; returns its index.")
      .def("remove", &TreeTable::remove, py::arg("index"),
           "Drop a tree (waits for a running batch that may use it).")
      .def("__getitem__", &TreeTable::get, py::arg("index"))
      .def("__len__", &TreeTable::size);

  m.def(
      "feed_and_draft",
      [](py::object trees, py::object tree_idx, py::object seq_ids, py::object tokens,
         py::object offsets, py::object feed, py::object contexts, py::object context_len,
         py::object max_tokens, py::object min_prob, bool backoff) {
        StepRows r;
        py::array keep[10];
        r.tree = array_of<int32_t>(tree_idx, "tree_idx", -1, &keep[0]);
        const py::ssize_t n = keep[0].shape(0);
        r.rows = static_cast<size_t>(n);
        r.seq = array_of<int64_t>(seq_ids, "seq_ids", n, &keep[1]);
        r.offsets = array_of<int64_t>(offsets, "offsets", n + 1, &keep[2]);
        r.tokens = array_of<int32_t>(tokens, "tokens", -1, &keep[3]);
        if (n && r.offsets[n] > keep[3].shape(0))
          throw py::value_error("offsets run past the end of tokens");
        if (!feed.is_none()) r.feed = array_of<int32_t>(feed, "feed", n, &keep[4]);
        r.context = array_of<int32_t>(contexts, "contexts", n, &keep[5], -1);
        r.stride = keep[5].strides(0) / static_cast<py::ssize_t>(sizeof(int32_t));
        r.columns = keep[5].shape(1);
        r.context_len = array_of<int32_t>(context_len, "context_len", n, &keep[6]);
        r.max_tokens = array_of<int32_t>(max_tokens, "max_tokens", n, &keep[7]);
        r.min_prob = array_of<double>(min_prob, "min_prob", n, &keep[8]);
        r.backoff = backoff;
        const TreeList list(trees);
        TreeTable* const table = list.table;
        int32_t width = 0;
        for (py::ssize_t i = 0; i < n; ++i) width = std::max(width, r.max_tokens[i]);
        width = std::min(width, static_cast<int32_t>(SuffixTree::kMaxDepthLimit));
        StepTimes times;
        py::array_t<int32_t> out;
        py::array_t<int32_t> lens(n);
        {
          std::shared_lock<std::shared_mutex> lock;
          if (table) {
            py::gil_scoped_release nogil;
            lock = std::shared_lock<std::shared_mutex>(table->mutex());
          }
          SuffixTree* const* ptrs = list.data();
          const size_t count = list.count();
          int32_t depth = 0;  // the output never needs more than the deepest tree used
          for (py::ssize_t i = 0; i < n; ++i)
            if (r.tree[i] >= 0 && static_cast<size_t>(r.tree[i]) < count && ptrs[r.tree[i]])
              depth = std::max(depth, ptrs[r.tree[i]]->max_depth());
          width = std::min(width, depth);
          out = py::array_t<int32_t>({n, static_cast<py::ssize_t>(width)});
          r.out = out.mutable_data();
          r.width = width;
          r.out_len = lens.mutable_data();
          py::gil_scoped_release nogil;
          times = feed_and_draft(ptrs, count, r);
        }
        return py::make_tuple(out, lens, times.feed_ns, times.draft_ns);
      },
      py::arg("trees"), py::arg("tree_idx"), py::arg("seq_ids"), py::arg("tokens"),
      py::arg("offsets"), py::arg("feed"), py::arg("contexts"), py::arg("context_len"),
      py::arg("max_tokens"), py::arg("min_prob"), py::arg("backoff") = true, kFeedAndDraftDoc);

  m.def(
      "hypothesis_drafts",
      [](py::object trees, py::object tree_idx, py::object contexts, py::object context_len,
         py::object verified, py::object sound, py::object max_tokens, py::object min_prob,
         int branches, int hypotheses_per_row, int threads) {
        HypothesisRows r;
        py::array keep[7];
        r.tree = array_of<int32_t>(tree_idx, "tree_idx", -1, &keep[0]);
        const py::ssize_t n = keep[0].shape(0);
        r.rows = static_cast<size_t>(n);
        r.context = array_of<int32_t>(contexts, "contexts", n, &keep[1], -1);
        r.stride = keep[1].strides(0) / static_cast<py::ssize_t>(sizeof(int32_t));
        r.columns = keep[1].shape(1);
        r.context_len = array_of<int32_t>(context_len, "context_len", n, &keep[2]);
        r.verified = array_of<int32_t>(verified, "verified", n, &keep[3], -1);
        r.verified_stride = keep[3].strides(0) / static_cast<py::ssize_t>(sizeof(int32_t));
        r.k_max = static_cast<int32_t>(keep[3].shape(1));
        r.sound = array_of<int64_t>(sound, "sound", n, &keep[4]);
        r.max_tokens = array_of<int32_t>(max_tokens, "max_tokens", n, &keep[5]);
        r.min_prob = array_of<double>(min_prob, "min_prob", n, &keep[6]);
        if (branches < 1 || branches > 16) throw py::value_error("branches must be in [1, 16]");
        if (hypotheses_per_row < 1) throw py::value_error("hypotheses per row must be >= 1");
        if (threads < 1) throw py::value_error("threads must be >= 1");
        r.branches = branches;
        r.hypotheses = hypotheses_per_row;
        r.threads = threads;
        const TreeList list(trees);
        TreeTable* const table = list.table;
        int32_t width = 0;
        for (py::ssize_t i = 0; i < n; ++i) width = std::max(width, r.max_tokens[i]);
        r.width = 1 + std::min(width, static_cast<int32_t>(SuffixTree::kMaxDepthLimit));
        const py::ssize_t H = hypotheses_per_row, K = r.k_max;
        py::array_t<int32_t> lengths({n, H}), branch_len({n, H}), draft_len(n);
        py::array_t<int32_t> tokens({n, H, K + 1}), drafts({n, H, K});
        py::array_t<int64_t> fallback(n);
        r.lengths = lengths.mutable_data();
        r.tokens = tokens.mutable_data();
        r.drafts = drafts.mutable_data();
        r.branch_len = branch_len.mutable_data();
        r.draft_len = draft_len.mutable_data();
        r.fallback = fallback.mutable_data();
        int64_t ns = 0;
        {
          std::shared_lock<std::shared_mutex> lock;
          py::gil_scoped_release nogil;
          if (table) lock = std::shared_lock<std::shared_mutex>(table->mutex());
          SuffixTree* const* ptrs = list.data();
          const size_t count = list.count();
          ns = hypotheses(ptrs, count, r);
        }
        return py::make_tuple(lengths, tokens, drafts, branch_len, draft_len, fallback, ns);
      },
      py::arg("trees"), py::arg("tree_idx"), py::arg("contexts"), py::arg("context_len"),
      py::arg("verified"), py::arg("sound"), py::arg("max_tokens"), py::arg("min_prob"),
      py::arg("branches"), py::arg("hypotheses"), py::arg("threads") = 1,
      "The lookahead's hypotheses of many rows in one call without the GIL, assembled: row "
      "``i`` (``trees[tree_idx[i]]``; a negative index: none) with ``max_tokens[i] > 0`` "
      "verifies ``verified[i, :sound[i]]`` in the step on the device; its outcomes are "
      "``(a, x)`` for each accepted count ``a`` in 0 .. ``sound[i]`` and ``x`` among the "
      "``branches`` most frequent continuations of ``contexts[i, :context_len[i]] + "
      "verified[i, :a]`` other than ``verified[i, a]`` (when ``a < sound[i]``), each with "
      "the tree's chance (``a``'s by ``path_probs`` times ``x``'s share); its ``hypotheses`` "
      "most likely outcomes (the more likely first; among equals the smaller ``a``, then "
      "the more frequent ``x``), each followed by its draft of at most ``max_tokens[i]`` "
      "tokens at ``min_prob[i]``, are hypotheses 0, 1, ....  Returns ``(lengths, tokens, "
      "drafts, branch_len, draft_len, fallback, ns)``: per row and hypothesis the tokens "
      "assumed (``a + 1``, 0: none) and those tokens (-1 padded; a cell without a "
      "hypothesis starts with -2), the draft after them (zero padded) and 1 + its length, "
      "each cut to the row's slots; per row those slots (while the chance of acceptance "
      "summed over its hypotheses is at least ``min_prob[i]``) and its fallback (the most "
      "tokens assumed, the more likely among equals); ``ns`` the call's CPU time, summed over "
      "its threads.  Up to ``threads`` threads share the rows (at least 64 drafting rows "
      "a thread); the output does not depend on how many.");

  m.def(
      "draft_lists",
      [](py::object drafts, py::object lengths) {
        py::array keep[2];
        const int32_t* len = array_of<int32_t>(lengths, "lengths", -1, &keep[1]);
        const py::ssize_t n = keep[1].shape(0);
        const int32_t* tok = array_of<int32_t>(drafts, "drafts", n, &keep[0], -1);
        const py::ssize_t width = keep[0].shape(1);
        const py::ssize_t stride = keep[0].strides(0) / static_cast<py::ssize_t>(sizeof(int32_t));
        py::list out(n);
        for (py::ssize_t i = 0; i < n; ++i) {
          if (len[i] < 0 || len[i] > width)
            throw py::value_error("lengths[" + std::to_string(i) + "] must be in [0, " +
                                  std::to_string(width) + "]");
          PyObject* row = PyList_New(len[i]);
          if (!row) throw py::error_already_set();
          for (int32_t j = 0; j < len[i]; ++j)
            PyList_SET_ITEM(row, j, PyLong_FromLong(tok[i * stride + j]));
          PyList_SET_ITEM(out.ptr(), i, row);
        }
        return out;
      },
      py::arg("drafts"), py::arg("lengths"),
      "The drafts of ``feed_and_draft`` as vLLM's ``list[list[int]]``: row ``i`` is "
      "``drafts[i, :lengths[i]]``.");
}

}  // namespace vllm_rl
