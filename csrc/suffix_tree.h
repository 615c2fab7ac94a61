// Depth-bounded suffix tree with occurrence counts: the drafter index of DAS
// (Distribution-Aware Speculative decoding, Sec. 4.1.2 "Adaptive nonparametric drafter").
//
// What is stored
// --------------
// A set of token sequences, each named by an integer id.  A sequence x of length n
// contributes n *strings*, one per start j: s_j = x[j, min(n, j + D)), its suffix cut to
// the depth limit D (max_depth).  The tree is the compacted trie of that multiset S:
//
//   * every node v spells a path string P(v); depth(v) = |P(v)| <= D;
//   * count(v) = number of strings in S that have P(v) as a prefix
//              = number of occurrences of P(v) in the stored sequences (|P(v)| <= D);
//   * a string of S ends at an explicit node (never inside an edge); the node records it
//     in `ends`, so count(v) = |ends(v)| + sum of count(child);
//   * canonical form: a non-root node has at least one ending string or at least two
//     children.  The node set is therefore a function of S alone, and the memory a
//     function of the stored sequences (and of which are still growing), since every
//     array has capacity ceil_pow2(size): memory_bytes() after removing a set of
//     sequences equals memory_bytes() before they were added.
//
// Edge labels are not copied: node v has a reference (ref, ref_end) with
// ref->tokens[ref_end - depth(v), ref_end) == P(v), into a live sequence.  When a
// sequence is removed, every surviving node that referenced it is pointed at another
// occurrence (an ending string or a child's reference), so tokens of removed sequences
// are freed at once.  Memory is O(stored tokens): at most 2 nodes per string.
//
// Operations (n = tokens added, m = matched length, b = draft length, D = max_depth)
// ----------------------------------------------------------------------------------
//   extend   append to a growing sequence: O(D) per token.  A growing sequence keeps
//            the end nodes of its strings shorter than D ("active" strings), and each new
//            token extends every one of them by one step (plus the new length-1 string).
//   insert   a finished sequence in one call (= extend + finish).
//   finish   seal a growing sequence: frees its active list, trims its buffers.
//   remove   O(n * nodes per path): decrement counts along each string, free nodes that
//            reach zero, merge nodes that fall out of canonical form, repoint references.
//   match    longest suffix of a context present in the tree (at most D tokens).  Each
//            probe is one top-down walk, O(k) for a suffix of length k; galloping
//            (1, 2, 4, ...) then bisection needs O(log m) probes: O(m log m) in total,
//            independent of the context length and of D.  A successful probe also
//            extends the occurrence its node references to the left, for free; when
//            that occurrence is the rollout the context follows, the second probe
//            already fails and the search ends.
//   draft    from the locus of the longest context suffix of length <= max(1, D - b)
//            (so that the tree still holds b tokens below it), follow the most frequent
//            child (ties: smallest token id) while the cumulative probability
//            prod count(child) / count(parent) stays >= min_prob; at most b tokens.
//            count(parent) includes strings that end at the parent (a stored sequence
//            ended there), as in SuffixDecoding.  Inside an edge the factor is exactly 1.
//
// Concurrency: a reader/writer lock per tree.  Queries share it, updates take it
// exclusively, so the Python bindings can release the GIL in every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vllm_rl {

using Token = int32_t;
using SeqId = int64_t;

// A sequence id the tree does not hold (KeyError in Python).
struct UnknownSequence : std::out_of_range {
  using std::out_of_range::out_of_range;
};

struct Draft {
  std::vector<Token> tokens;  // the proposed continuation
  std::vector<double> probs;  // probs[i]: cumulative probability of tokens[0..i]
  int match_len = 0;          // length of the context suffix the draft continues
  int64_t match_count = 0;    // occurrences of that suffix (all tokens if match_len == 0)
};

class SuffixTree;

// One decode step of many rows for feed_and_draft (below): plain arrays, row-major, one
// entry per row unless stated.  A row whose tree index is negative is skipped.
struct StepRows {
  size_t rows = 0;
  const int32_t* tree = nullptr;       // index into the tree list; < 0: no tree
  const int64_t* seq = nullptr;        // the row's growing sequence id in its tree
  const Token* tokens = nullptr;       // new tokens, all rows back to back
  const int64_t* offsets = nullptr;    // rows + 1 entries: row i's are [offsets[i], offsets[i+1])
  const int32_t* feed = nullptr;       // how many of them to append (nullptr: all)
  const Token* context = nullptr;      // row i's context is context[i * stride, + context_len[i])
  int64_t stride = 0;                  // tokens between rows of `context`
  int64_t columns = 0;                 // a context holds at most this many tokens
  const int32_t* context_len = nullptr;
  const int32_t* max_tokens = nullptr; // draft budget (0: feed only)
  const double* min_prob = nullptr;    // cumulative-probability cutoff per row
  bool backoff = true;
  Token* out = nullptr;                // row i's draft: out[i * width, + out_len[i])
  int32_t width = 0;
  int32_t* out_len = nullptr;
};

// The lookahead's hypotheses, assembled (hypotheses(), below; vllm_rl/das/hypotheses.py).
// Row i verifies sound[i] drafts verified[i, :sound[i]] in the step on the device; its
// outcomes are (a, x) for each accepted count a = 0 .. sound[i] and x among the
// `branches` most frequent next tokens after the context and d[:a] other than d[a]; its
// hypotheses are the `hypotheses` most likely of them (by the tree's chance, the more
// likely first; among equals the smaller a, then the more frequent x).  Plain arrays,
// row-major, one entry per row unless stated.
struct HypothesisRows {
  size_t rows = 0;
  const int32_t* tree = nullptr;       // index into the tree list; < 0: no tree
  const Token* context = nullptr;      // row i's context is context[i * stride, + context_len[i])
  int64_t stride = 0;
  int64_t columns = 0;
  const int32_t* context_len = nullptr;
  const Token* verified = nullptr;     // row i's drafts in the step on the device:
  int64_t verified_stride = 0;         //   verified[i * verified_stride, + k_max)
  int32_t k_max = 0;
  const int64_t* sound = nullptr;      // how many of them are sound, in [0, k_max]
  const int32_t* max_tokens = nullptr; // draft after each branch token (<= 0: no hypotheses)
  const double* min_prob = nullptr;    // cumulative-probability cutoff of each draft
  int32_t branches = 1;                // next tokens per accepted count
  int32_t width = 1;                   // 1 + the longest draft after a branch token
  int32_t hypotheses = 0;              // H per row: the most likely outcomes kept
  int32_t threads = 1;                 // at most this many threads share the rows
  int32_t* lengths = nullptr;          // [rows, H]: tokens assumed (a + 1; 0: no hypothesis)
  Token* tokens = nullptr;             // [rows, H, k_max + 1]: d_1 .. d_a, the branch token,
                                       //   then -1; a cell without a hypothesis starts -2
  Token* drafts = nullptr;             // [rows, H, k_max]: the draft after them (zero padded)
  int32_t* branch_len = nullptr;       // [rows, H]: 1 + that draft's length (0: none)
  int32_t* draft_len = nullptr;        // [rows]: the slots it verifies (hypotheses())
  int64_t* fallback = nullptr;         // [rows]: the most tokens assumed, first branch among equals
};

struct HypothesisWork;  // one thread's share of hypotheses() (suffix_tree.cc)

struct StepTimes {  // CPU time of the calling thread in each phase
  int64_t feed_ns = 0;
  int64_t draft_ns = 0;
};

class SuffixTree {
 public:
  static constexpr int kMaxDepthLimit = 65535;

  // prior: λ >= 0 added to each count a draft's probability divides by (see draft_from).
  explicit SuffixTree(int max_depth = 64, double prior = 0.0);
  ~SuffixTree();
  SuffixTree(const SuffixTree&) = delete;
  SuffixTree& operator=(const SuffixTree&) = delete;

  // Updates (exclusive lock).
  void extend(SeqId id, const std::vector<Token>& tokens);  // creates the sequence if new
  void insert(SeqId id, const std::vector<Token>& tokens);  // a finished sequence; id must be new
  void finish(SeqId id);                                    // seal a growing sequence
  void remove(SeqId id);

  // Queries (shared lock).
  std::pair<int, int64_t> match(const std::vector<Token>& context) const;
  int64_t count(const std::vector<Token>& pattern) const;  // occurrences, |pattern| <= D
  // backoff: when the longest suffix has no continuation in the tree (e.g. its only
  // occurrence is the growing rollout the context comes from), draft from the longest
  // shorter suffix that has one (bisection: having a continuation is monotone in length).
  Draft draft(const std::vector<Token>& context, int max_tokens, double min_prob,
              bool backoff = false) const;
  // draft(context, max_tokens, min_prob, backoff = true) the way feed_and_draft computes
  // it for a row of the growing sequence `id` (from its active list, no walks).  Writes
  // *d and returns true, or returns false where that path falls back to draft() (the
  // context does not end like the sequence for long enough, or it is not growing).
  // For tests: with true, *d equals draft()'s result in every field.
  bool draft_from_rollout(SeqId id, const std::vector<Token>& context, int max_tokens,
                          double min_prob, Draft* d) const;
  // max_tokens: one budget per context, or a single budget for all.
  std::vector<Draft> draft_batch(const std::vector<std::vector<Token>>& contexts,
                                 const std::vector<int>& max_tokens, double min_prob) const;

  int max_depth() const { return max_depth_; }
  double prior() const { return prior_; }
  // The probability that the next token is a continuation seen `count` times among the
  // `total` occurrences of its context: count / (total + λ) (λ = 1: PPM's method A,
  // which keeps 1 / (total + 1) for a token never seen there).
  double next_prob(uint32_t count, uint32_t total) const {
    return static_cast<double>(count) / (static_cast<double>(total) + prior_);
  }
  // The sequence id a batch row may extend: unknown (created on append) or growing.
  bool can_extend(SeqId id) const;
  int64_t num_nodes() const;  // explicit nodes, root included (an empty tree has 1)
  int64_t num_tokens() const;
  int64_t num_sequences() const;
  bool contains(SeqId id) const;
  std::vector<SeqId> sequences() const;  // ascending
  std::vector<Token> sequence(SeqId id) const;
  bool is_growing(SeqId id) const;
  // Bytes requested from the allocator by this tree (the object, nodes, child and end
  // arrays, sequence records and buffers, the id directory); malloc's own per-block
  // overhead is not included.  Kept up to date in O(1).
  size_t memory_bytes() const;
  // Verifies every invariant above from scratch; returns "" or the first violation.
  std::string check() const;

 private:
  struct Seq;
  // A stored string s_start of `seq`; it ends at the node holding this record.
  struct EndRef {
    Seq* seq;
    uint32_t start;
  };
  struct Node {
    Node* parent = nullptr;
    Seq* ref = nullptr;       // P(this) == ref->tokens[ref_end - depth, ref_end)
    Token* ctok = nullptr;    // child block: ctok[cap] (ascending), then Node* kids[cap]
    EndRef* ends = nullptr;   // strings ending here, in no particular order
    uint32_t count = 0;
    uint32_t ref_end = 0;
    uint32_t nchild = 0;
    uint32_t nends = 0;
    uint16_t len = 0;         // edge label length (0 only for the root)
    uint16_t depth = 0;
  };
  struct Seq {
    SeqId id = 0;
    bool growing = true;
    std::vector<Token> tokens;
    std::vector<uint32_t> slot;  // slot[j]: index of s_j's EndRef in its end node
    std::vector<Node*> active;   // end nodes of s_j shorter than D, oldest j first
  };
  struct DirEntry {
    SeqId id;
    Seq* seq;
  };
  struct Locus {  // `off` tokens into the edge above `node` (off == node->len: at node)
    const Node* node;
    uint32_t off;
  };
  // A continuation (branch_points): its token, the locus after it, its share and the
  // length of the suffix it continues.
  struct Branch {
    Token tok;
    Locus next;
    double share;
    uint32_t m;
  };
  static constexpr int kMaxBranches = 16;

  // Sequences.
  Seq* find_seq(SeqId id) const;
  Seq* get_seq(SeqId id) const;  // throws UnknownSequence
  Seq* create_seq(SeqId id);
  void seal(Seq* x);
  void destroy_seq(Seq* x);

  // Tree updates.
  void append(Seq* x, Token t);
  Node* extend_string(Seq* x, Node* v, Token t, uint32_t end);
  Node* descend(Node* v, Token t, Seq* x, uint32_t end);
  void maybe_merge(Node* v);
  void remove_strings(Seq* x);
  void repoint(Node* c, const Seq* x, std::vector<Node*>& stack);

  void extend_unlocked(SeqId id, const Token* tokens, size_t n);

  // Queries.  A context is a pointer to its tokens and their number; only the last
  // max_depth are read.
  uint32_t walk(const Token* pat, uint32_t k, Locus* out) const;
  uint32_t longest_suffix(const Token* context, size_t n, uint32_t cap, Locus* out) const;
  // The locus one token t past `at`, if the tree stores that string.
  static bool step(Locus at, Token t, Locus* out);
  // The longest suffix shorter than m (all present) whose locus satisfies `ok`, a
  // predicate monotone in the suffix length; its locus in *at (the root for 0).
  template <class Ok>
  uint32_t back_off(const Token* context, size_t n, uint32_t m, Ok ok, Locus* at) const;
  // Writes the draft to out[0, len) (and its cumulative probabilities to probs unless
  // null); out must hold min(max_tokens, max_depth) tokens.  Returns len.
  int draft_into(const Token* context, size_t n, int max_tokens, double min_prob, bool backoff,
                 Token* out, double* probs, int* match_len, int64_t* match_count) const;
  // The rest of draft_into from the locus of its suffix of length m; b >= 1.
  int draft_from(Locus at, uint32_t m, uint32_t b, double min_prob, Token* out, double* probs,
                 int* match_len, int64_t* match_count) const;
  // draft_into with backoff for a context that ends like the growing sequence `id`, from
  // that sequence's active list; -1 when undecided there (then call draft_into).
  int draft_from_active(SeqId id, const Token* context, size_t n, int max_tokens,
                        double min_prob, Token* out, double* probs, int* match_len,
                        int64_t* match_count) const;
  // The `branches` most frequent continuations of the context's longest suffix that
  // continues with a token other than `exclude` (< 0: any token), given the locus `at` of
  // its longest present suffix of m <= cap tokens (longest_suffix; the hypotheses condition
  // on at most D - b - 1 tokens so that the branch and a draft of b tokens after it fit the
  // depth): each one's token, the locus after it, its share of the continuations other
  // than `exclude` (next_prob) and the suffix's length, most frequent first (ties: the
  // smaller token first, as draft_from).  Where that suffix has fewer, each shorter
  // suffix with a continuation not found yet adds those, most frequent first, with their
  // share among the continuations not found (nor `exclude`) times the escape
  // λ / (total + λ) of each longer suffix (PPM's method A with exclusion; none with
  // λ = 0).  At most min(branches, kMaxBranches).  Returns the branches.
  int branch_points(const Token* context, size_t n, Locus at, uint32_t m, Token exclude,
                    int branches, Branch* out) const;
  // q[j]: the tree's probability of d[j] after the context and d[0, j) (next_prob along
  // the context's longest suffix of at most D - k tokens; 0 from the first token not
  // seen there, and for every token when no suffix is stored).
  void path_probs(const Token* context, size_t n, const Token* d, int k, double* q) const;
  // path_probs from `at`, the locus of that suffix, of m tokens.
  void path_probs_at(Locus at, uint32_t m, const Token* d, int k, double* q) const;
  static bool continues(const Locus& l) { return l.off < l.node->len || l.node->nchild > 0; }
  Draft draft_unlocked(const std::vector<Token>& context, int max_tokens, double min_prob,
                       bool backoff = false) const;

  // Node storage and the canonical-capacity arrays.
  static const Token* label(const Node* v);
  static Node** kids(const Node* v);
  static Node* find_child(const Node* v, Token t, uint32_t* pos);
  Node* new_node(Node* parent, Seq* ref, uint32_t ref_end, uint32_t len, uint32_t count);
  void free_node(Node* v);
  void child_insert(Node* v, uint32_t pos, Token t, Node* c);
  void child_erase(Node* v, uint32_t pos);
  void ends_push(Node* v, Seq* x, uint32_t start);
  void ends_erase(Node* v, uint32_t idx);
  template <class T>
  T* reshape(T* p, uint32_t old_n, uint32_t new_n);
  template <class T>
  void push_canonical(std::vector<T>& v, const T& value);

  friend std::vector<Draft> draft_many(const std::vector<const SuffixTree*>&,
                                       const std::vector<std::vector<Token>>&,
                                       const std::vector<int>&, double, bool);
  friend StepTimes feed_and_draft(SuffixTree* const* trees, size_t num_trees,
                                  const StepRows& rows);
  friend int64_t hypotheses(SuffixTree* const* trees, size_t num_trees,
                            const HypothesisRows& rows);
  friend struct HypothesisWork;

  const int max_depth_;
  const double prior_;
  Node root_;
  DirEntry* dir_ = nullptr;  // sorted by id
  uint32_t ndir_ = 0;
  int64_t nodes_ = 1;
  size_t bytes_ = 0;
  mutable std::shared_mutex mu_;
};

// Drafts for many (tree, context) pairs, e.g. requests of different problems, each with
// its per-problem tree (DAS Sec. 4.1.2).  Same semantics as SuffixTree::draft.
std::vector<Draft> draft_many(const std::vector<const SuffixTree*>& trees,
                              const std::vector<std::vector<Token>>& contexts,
                              const std::vector<int>& max_tokens, double min_prob,
                              bool backoff = false);

// One decode step of a DAS drafter over many rows, each with its tree (DAS Sec. 4.1.2:
// the per-problem trees are updated online and drafted from at every step):
//   1. feed: every row with a tree appends its new tokens to its growing sequence
//      (rows[i].seq, created if new), under its tree's exclusive lock;
//   2. draft: then every row with a tree and max_tokens > 0 drafts from its context,
//      under its tree's shared lock, with SuffixTree::draft's semantics (per-row
//      budget and min_prob, `backoff` for all).
// Every draft sees every row's feed, so the result equals extend() for all rows followed
// by draft() for each.  With backoff, a row whose context ends like its growing sequence
// finds its suffix from that sequence's active list (draft_from_active: no walks from
// the root, same result), falling back to the walk where that list cannot decide.  Consecutive rows of one tree share one lock acquisition.  The
// arrays are checked first (std::invalid_argument naming the row); a row whose sequence
// is finished raises std::invalid_argument when reached, after the rows before it were
// fed.  No Python: the caller may run it without the GIL.
StepTimes feed_and_draft(SuffixTree* const* trees, size_t num_trees, const StepRows& rows);

// The lookahead's hypotheses for many rows (DAS under async scheduling: the drafts of
// step n + 1 are made before step n's tokens are known), assembled: every row with a tree
// and max_tokens > 0, for each accepted count a, gets SuffixTree::branch_points on its
// context followed by verified[:a], excluding verified[a] when a < sound (the token after
// a rejected draft is not that draft), under its tree's shared lock; the outcome (a, x)'s
// chance is P(a) (path_probs) times x's share; the `hypotheses` most likely outcomes
// (HypothesisRows) get their drafts, each draft's probability from 1 given its outcome;
// the row verifies the leading slots whose
// chance of acceptance, summed over its hypotheses (the outcome's chance times the
// draft's probability), reaches min_prob, and every draft is cut to them; the
// outputs are written whole (zeros where there is no hypothesis).  Checked first
// (std::invalid_argument naming the row).  Rows are independent, so up to rows.threads
// threads share them (at least 64 drafting rows a thread), chunk by chunk: the output
// does not depend on the number.  No Python: the caller may run it without the GIL.
// Returns the CPU time of the drafts (ns), summed over the threads.
int64_t hypotheses(SuffixTree* const* trees, size_t num_trees, const HypothesisRows& rows);

}  // namespace vllm_rl
