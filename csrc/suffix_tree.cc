// Implementation of the depth-bounded suffix tree; invariants are stated in suffix_tree.h.
#include "suffix_tree.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace vllm_rl {
namespace {

// Canonical capacity of an array holding n elements.
uint32_t ceil_pow2(uint32_t n) {
  return n <= 1 ? n : uint32_t{1} << (32 - __builtin_clz(n - 1));
}

size_t align8(size_t bytes) { return (bytes + 7) & ~size_t{7}; }

size_t child_block_bytes(uint32_t cap) {
  return cap ? align8(cap * sizeof(Token)) + cap * sizeof(void*) : 0;
}

void* xmalloc(size_t bytes) {
  void* p = std::malloc(bytes);
  if (!p) throw std::bad_alloc();
  return p;
}

void corrupted(const char* what) { throw std::logic_error(std::string("suffix tree: ") + what); }

void check_min_prob(double min_prob) {
  if (!(min_prob >= 0.0 && min_prob <= 1.0))
    throw std::invalid_argument("min_prob must be in [0, 1]");
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Node storage.  Every allocation goes through these helpers, which keep bytes_ exact.

const Token* SuffixTree::label(const Node* v) {
  return v->ref->tokens.data() + (v->ref_end - v->len);
}

SuffixTree::Node** SuffixTree::kids(const Node* v) {
  const size_t cap = ceil_pow2(v->nchild);
  return reinterpret_cast<Node**>(reinterpret_cast<char*>(v->ctok) + align8(cap * sizeof(Token)));
}

SuffixTree::Node* SuffixTree::find_child(const Node* v, Token t, uint32_t* pos) {
  const Token* begin = v->ctok;
  const Token* end = begin + v->nchild;
  const Token* it = std::lower_bound(begin, end, t);
  if (pos) *pos = static_cast<uint32_t>(it - begin);
  return (it != end && *it == t) ? kids(v)[it - begin] : nullptr;
}

SuffixTree::Node* SuffixTree::new_node(Node* parent, Seq* ref, uint32_t ref_end, uint32_t len,
                                       uint32_t count) {
  Node* v = new Node;
  v->parent = parent;
  v->ref = ref;
  v->ref_end = ref_end;
  v->len = static_cast<uint16_t>(len);
  v->depth = static_cast<uint16_t>(parent->depth + len);
  v->count = count;
  bytes_ += sizeof(Node);
  ++nodes_;
  return v;
}

void SuffixTree::free_node(Node* v) {
  if (v->ctok) {
    std::free(v->ctok);
    bytes_ -= child_block_bytes(ceil_pow2(v->nchild));
  }
  if (v->ends) {
    std::free(v->ends);
    bytes_ -= ceil_pow2(v->nends) * sizeof(EndRef);
  }
  delete v;
  bytes_ -= sizeof(Node);
  --nodes_;
}

void SuffixTree::child_insert(Node* v, uint32_t pos, Token t, Node* c) {
  const uint32_t n = v->nchild, old_cap = ceil_pow2(n), new_cap = ceil_pow2(n + 1);
  Token* old_tok = v->ctok;
  Node** old_kids = n ? kids(v) : nullptr;
  Token* tok = old_tok;
  Node** kid = old_kids;
  if (new_cap != old_cap) {
    tok = static_cast<Token*>(xmalloc(child_block_bytes(new_cap)));
    bytes_ += child_block_bytes(new_cap);
    kid = reinterpret_cast<Node**>(reinterpret_cast<char*>(tok) + align8(new_cap * sizeof(Token)));
    if (pos) {
      std::memcpy(tok, old_tok, pos * sizeof(Token));
      std::memcpy(kid, old_kids, pos * sizeof(Node*));
    }
  }
  if (n > pos) {
    std::memmove(tok + pos + 1, old_tok + pos, (n - pos) * sizeof(Token));
    std::memmove(kid + pos + 1, old_kids + pos, (n - pos) * sizeof(Node*));
  }
  tok[pos] = t;
  kid[pos] = c;
  if (new_cap != old_cap && old_tok) {
    std::free(old_tok);
    bytes_ -= child_block_bytes(old_cap);
  }
  v->ctok = tok;
  v->nchild = n + 1;
}

void SuffixTree::child_erase(Node* v, uint32_t pos) {
  const uint32_t n = v->nchild, old_cap = ceil_pow2(n), new_cap = ceil_pow2(n - 1);
  Token* old_tok = v->ctok;
  Node** old_kids = kids(v);
  if (new_cap == old_cap) {
    std::memmove(old_tok + pos, old_tok + pos + 1, (n - pos - 1) * sizeof(Token));
    std::memmove(old_kids + pos, old_kids + pos + 1, (n - pos - 1) * sizeof(Node*));
    v->nchild = n - 1;
    return;
  }
  Token* tok = nullptr;
  if (new_cap) {
    tok = static_cast<Token*>(xmalloc(child_block_bytes(new_cap)));
    bytes_ += child_block_bytes(new_cap);
    Node** kid =
        reinterpret_cast<Node**>(reinterpret_cast<char*>(tok) + align8(new_cap * sizeof(Token)));
    std::memcpy(tok, old_tok, pos * sizeof(Token));
    std::memcpy(kid, old_kids, pos * sizeof(Node*));
    std::memcpy(tok + pos, old_tok + pos + 1, (n - pos - 1) * sizeof(Token));
    std::memcpy(kid + pos, old_kids + pos + 1, (n - pos - 1) * sizeof(Node*));
  }
  std::free(old_tok);
  bytes_ -= child_block_bytes(old_cap);
  v->ctok = tok;
  v->nchild = n - 1;
}

// Resizes a trivially copyable array from old_n to new_n elements, keeping the first
// min(old_n, new_n); reallocates only when the canonical capacity changes.
template <class T>
T* SuffixTree::reshape(T* p, uint32_t old_n, uint32_t new_n) {
  const uint32_t old_cap = ceil_pow2(old_n), new_cap = ceil_pow2(new_n);
  if (old_cap == new_cap) return p;
  T* q = nullptr;
  if (new_cap) {
    q = static_cast<T*>(xmalloc(new_cap * sizeof(T)));
    bytes_ += new_cap * sizeof(T);
    const uint32_t keep = std::min(old_n, new_n);
    if (keep) std::memcpy(static_cast<void*>(q), p, keep * sizeof(T));
  }
  if (p) {
    std::free(p);
    bytes_ -= old_cap * sizeof(T);
  }
  return q;
}

template <class T>
void SuffixTree::push_canonical(std::vector<T>& v, const T& value) {
  if (v.size() == v.capacity()) {
    const size_t before = v.capacity();
    v.reserve(ceil_pow2(static_cast<uint32_t>(v.size() + 1)));
    bytes_ += (v.capacity() - before) * sizeof(T);
  }
  v.push_back(value);
}

void SuffixTree::ends_push(Node* v, Seq* x, uint32_t start) {
  v->ends = reshape(v->ends, v->nends, v->nends + 1);
  v->ends[v->nends] = EndRef{x, start};
  x->slot[start] = v->nends;
  ++v->nends;
}

// O(1): the last record fills the hole and its sequence's slot is updated.
void SuffixTree::ends_erase(Node* v, uint32_t idx) {
  const uint32_t last = v->nends - 1;
  if (idx != last) {
    v->ends[idx] = v->ends[last];
    v->ends[idx].seq->slot[v->ends[idx].start] = idx;
  }
  v->ends = reshape(v->ends, v->nends, last);
  v->nends = last;
}

// ---------------------------------------------------------------------------------------
// Sequences: a directory sorted by id.

SuffixTree::SuffixTree(int max_depth, double prior) : max_depth_(max_depth), prior_(prior) {
  if (max_depth < 1 || max_depth > kMaxDepthLimit)
    throw std::invalid_argument("max_depth must be in [1, 65535]");
  if (!(prior >= 0.0 && prior <= 1e6)) throw std::invalid_argument("prior must be in [0, 1e6]");
  bytes_ = sizeof(*this);
}

SuffixTree::~SuffixTree() {
  // Free every node below the root, then the sequences.
  std::vector<Node*> stack;
  for (uint32_t i = 0; i < root_.nchild; ++i) stack.push_back(kids(&root_)[i]);
  while (!stack.empty()) {
    Node* v = stack.back();
    stack.pop_back();
    for (uint32_t i = 0; i < v->nchild; ++i) stack.push_back(kids(v)[i]);
    free_node(v);
  }
  std::free(root_.ctok);
  for (uint32_t i = 0; i < ndir_; ++i) delete dir_[i].seq;
  std::free(dir_);
}

SuffixTree::Seq* SuffixTree::find_seq(SeqId id) const {
  const DirEntry* it = std::lower_bound(dir_, dir_ + ndir_, id,
                                        [](const DirEntry& e, SeqId k) { return e.id < k; });
  return (it != dir_ + ndir_ && it->id == id) ? it->seq : nullptr;
}

SuffixTree::Seq* SuffixTree::get_seq(SeqId id) const {
  Seq* x = find_seq(id);
  if (!x) throw UnknownSequence("unknown sequence id " + std::to_string(id));
  return x;
}

SuffixTree::Seq* SuffixTree::create_seq(SeqId id) {
  const DirEntry* it = std::lower_bound(dir_, dir_ + ndir_, id,
                                        [](const DirEntry& e, SeqId k) { return e.id < k; });
  const uint32_t pos = static_cast<uint32_t>(it - dir_);
  Seq* x = new Seq;
  x->id = id;
  bytes_ += sizeof(Seq);
  dir_ = reshape(dir_, ndir_, ndir_ + 1);
  std::memmove(static_cast<void*>(dir_ + pos + 1), dir_ + pos, (ndir_ - pos) * sizeof(DirEntry));
  dir_[pos] = DirEntry{id, x};
  ++ndir_;
  return x;
}

// A finished sequence needs no active list, and its buffers are trimmed to size.
void SuffixTree::seal(Seq* x) {
  bytes_ -= x->tokens.capacity() * sizeof(Token) + x->slot.capacity() * sizeof(uint32_t) +
            x->active.capacity() * sizeof(Node*);
  std::vector<Token>(x->tokens).swap(x->tokens);
  std::vector<uint32_t>(x->slot).swap(x->slot);
  std::vector<Node*>().swap(x->active);
  bytes_ += x->tokens.capacity() * sizeof(Token) + x->slot.capacity() * sizeof(uint32_t);
  x->growing = false;
}

void SuffixTree::destroy_seq(Seq* x) {
  const DirEntry* it = std::lower_bound(dir_, dir_ + ndir_, x->id,
                                        [](const DirEntry& e, SeqId k) { return e.id < k; });
  const uint32_t pos = static_cast<uint32_t>(it - dir_);
  std::memmove(static_cast<void*>(dir_ + pos), dir_ + pos + 1,
               (ndir_ - pos - 1) * sizeof(DirEntry));
  dir_ = reshape(dir_, ndir_, ndir_ - 1);
  --ndir_;
  bytes_ -= sizeof(Seq) + x->tokens.capacity() * sizeof(Token) +
            x->slot.capacity() * sizeof(uint32_t) + x->active.capacity() * sizeof(Node*);
  delete x;
}

// ---------------------------------------------------------------------------------------
// Appending a token.

// The node spelling P(v) + t, created if absent: either an existing child whose edge
// is one token long, a new node splitting a longer edge after its first token, or a new
// leaf referencing x[.., end).  The caller makes a string end there.
SuffixTree::Node* SuffixTree::descend(Node* v, Token t, Seq* x, uint32_t end) {
  uint32_t pos;
  Node* c = find_child(v, t, &pos);
  if (!c) {
    Node* leaf = new_node(v, x, end, 1, 0);
    child_insert(v, pos, t, leaf);
    return leaf;
  }
  if (c->len == 1) return c;
  // P(m) is a prefix of P(c), so c's reference covers it.
  Node* m = new_node(v, c->ref, c->ref_end - c->len + 1, 1, c->count);
  c->len -= 1;
  c->parent = m;
  child_insert(m, 0, label(c)[0], c);
  kids(v)[pos] = m;
  return m;
}

// Restores canonical form at v: a non-root node with no ending string and a single
// child is merged into that child (the child keeps its identity and reference).
void SuffixTree::maybe_merge(Node* v) {
  if (v == &root_ || v->nends != 0 || v->nchild != 1) return;
  Node* c = kids(v)[0];
  Node* p = v->parent;
  uint32_t pos;
  find_child(p, label(v)[0], &pos);
  c->len = static_cast<uint16_t>(c->len + v->len);
  c->parent = p;
  kids(p)[pos] = c;
  free_node(v);
}

// The string s_j of x (j = end - 1 - depth(v)) ends at v and grows by t.  Returns its
// new end node.  Only v and the nodes just below it change; all other nodes keep their
// identity, so the end nodes of the other active strings stay valid.
SuffixTree::Node* SuffixTree::extend_string(Seq* x, Node* v, Token t, uint32_t end) {
  if (v != &root_ && v->nends == 1) {
    // v holds only this string.  Two cases need no allocation:
    if (v->nchild == 0) {
      // (a) v is a leaf: lengthen its edge.
      v->len += 1;
      v->depth += 1;
      v->ref = x;
      v->ref_end = end;
      return v;
    }
    Node* c = kids(v)[0];
    if (v->nchild == 1 && v->ctok[0] == t && c->len >= 2) {
      // (b) the single child continues with t: move the boundary one token down.
      v->len += 1;
      v->depth += 1;
      v->ref = x;
      v->ref_end = end;
      c->len -= 1;
      v->ctok[0] = label(c)[0];
      return v;
    }
  }
  const uint32_t j = end - 1 - v->depth;
  Node* u = descend(v, t, x, end);
  ends_erase(v, x->slot[j]);
  ends_push(u, x, j);
  u->count += 1;
  maybe_merge(v);
  return u;
}

void SuffixTree::append(Seq* x, Token t) {
  const uint32_t n = static_cast<uint32_t>(x->tokens.size());
  const uint32_t end = n + 1;
  push_canonical(x->tokens, t);
  push_canonical(x->slot, uint32_t{0});
  // Active strings are ordered oldest (deepest) first; the oldest reaches D first.
  for (Node*& v : x->active) v = extend_string(x, v, t, end);
  if (!x->active.empty() && x->active.front()->depth == max_depth_)
    x->active.erase(x->active.begin());
  // The new string s_n = [t].
  Node* u = descend(&root_, t, x, end);
  root_.count += 1;
  u->count += 1;
  ends_push(u, x, n);
  if (u->depth < max_depth_) push_canonical(x->active, u);
}

// ---------------------------------------------------------------------------------------
// Removing a sequence.

void SuffixTree::remove_strings(Seq* x) {
  const uint32_t n = static_cast<uint32_t>(x->tokens.size());
  const Token* tok = x->tokens.data();
  std::vector<Node*> path;
  // Phase 1: take every string of x out of the counts.  The walk follows child keys
  // (x's own tokens) and edge lengths only, so it reads no references.
  for (uint32_t j = 0; j < n; ++j) {
    const uint32_t len = std::min<uint32_t>(n - j, max_depth_);
    path.clear();
    Node* v = &root_;
    while (v->depth < len) {
      v = find_child(v, tok[j + v->depth], nullptr);
      if (!v) corrupted("stored string not found");
      path.push_back(v);
    }
    if (v->depth != len) corrupted("stored string ends inside an edge");
    ends_erase(v, x->slot[j]);
    root_.count -= 1;
    // Counts never increase downwards, so the nodes reaching zero are a tail of the
    // path, and nothing else hangs below them.
    size_t dead = path.size();
    for (size_t i = 0; i < path.size(); ++i)
      if (--path[i]->count == 0 && dead == path.size()) dead = i;
    if (dead < path.size()) {
      Node* p = dead ? path[dead - 1] : &root_;
      uint32_t pos;
      find_child(p, tok[j + p->depth], &pos);
      child_erase(p, pos);
      for (size_t i = dead; i < path.size(); ++i) free_node(path[i]);
      maybe_merge(p);  // p lost a child
    } else {
      maybe_merge(v);  // v lost an ending string
    }
  }
  // Phase 2: every surviving node that still references x has P(v) occurring in x at
  // some start j, so the walk of s_j reaches it; point it at another occurrence.
  std::vector<Node*> stack;
  for (uint32_t j = 0; j < n; ++j) {
    const uint32_t len = std::min<uint32_t>(n - j, max_depth_);
    Node* v = &root_;
    while (v->depth < len) {
      v = find_child(v, tok[j + v->depth], nullptr);
      if (!v) break;
      if (v->ref == x) repoint(v, x, stack);
    }
  }
}

// Points c (and, on the way, the nodes below it that also reference x) at an occurrence
// in a live sequence: an ending string, else a child's reference.
void SuffixTree::repoint(Node* c, const Seq* x, std::vector<Node*>& stack) {
  stack.clear();
  Node* w = c;
  while (w->ref == x) {
    if (w->nends) {  // x's own ending strings are gone already
      w->ref = w->ends[0].seq;
      w->ref_end = w->ends[0].start + w->depth;
      break;
    }
    // No string ends at w, so it has at least two children: prefer one already live.
    stack.push_back(w);
    Node** ch = kids(w);
    Node* next = ch[0];
    for (uint32_t i = 0; i < w->nchild; ++i)
      if (ch[i]->ref != x) {
        next = ch[i];
        break;
      }
    w = next;
  }
  while (!stack.empty()) {  // a prefix of a live occurrence is a live occurrence
    Node* u = stack.back();
    stack.pop_back();
    u->ref = w->ref;
    u->ref_end = w->ref_end - w->len;
    w = u;
  }
}

// ---------------------------------------------------------------------------------------
// Public updates.

void SuffixTree::extend_unlocked(SeqId id, const Token* tokens, size_t n) {
  Seq* x = find_seq(id);
  if (x && !x->growing)
    throw std::invalid_argument("sequence " + std::to_string(id) + " is finished");
  if (uint64_t{root_.count} + n > UINT32_MAX)
    throw std::length_error("a suffix tree holds at most 2^32 - 1 tokens");
  if (!x) x = create_seq(id);
  for (size_t i = 0; i < n; ++i) append(x, tokens[i]);
}

void SuffixTree::extend(SeqId id, const std::vector<Token>& tokens) {
  std::unique_lock lock(mu_);
  extend_unlocked(id, tokens.data(), tokens.size());
}

void SuffixTree::insert(SeqId id, const std::vector<Token>& tokens) {
  std::unique_lock lock(mu_);
  if (find_seq(id))
    throw std::invalid_argument("sequence " + std::to_string(id) + " already exists");
  if (uint64_t{root_.count} + tokens.size() > UINT32_MAX)
    throw std::length_error("a suffix tree holds at most 2^32 - 1 tokens");
  Seq* x = create_seq(id);
  for (Token t : tokens) append(x, t);
  seal(x);
}

void SuffixTree::finish(SeqId id) {
  std::unique_lock lock(mu_);
  Seq* x = get_seq(id);
  if (x->growing) seal(x);
}

void SuffixTree::remove(SeqId id) {
  std::unique_lock lock(mu_);
  Seq* x = get_seq(id);
  remove_strings(x);
  destroy_seq(x);
}

// ---------------------------------------------------------------------------------------
// Queries.

// Follows pat[0, k) from the root; returns how many tokens matched and where it stopped.
uint32_t SuffixTree::walk(const Token* pat, uint32_t k, Locus* out) const {
  const Node* v = &root_;
  uint32_t off = 0, i = 0;
  while (i < k) {
    if (off == v->len) {
      const Node* c = find_child(v, pat[i], nullptr);
      if (!c) break;
      v = c;
      off = 1;
      ++i;
    } else {
      const Token* lab = label(v);
      while (i < k && off < v->len && lab[off] == pat[i]) ++off, ++i;
      if (i < k && off < v->len) break;
    }
  }
  *out = Locus{v, off};
  return i;
}

// The longest suffix of the context, at most `cap` tokens, that the tree contains.
// Containment is monotone in the suffix length (a suffix of a stored substring is
// stored), so the answer is the lo with suffix lo present and lo + 1 absent: probe
// lengths 1, 2, 4, ... until one fails, then bisect; O(log m) probes, each one top-down
// walk of O(k) for length k, O(m log m) in total.
//
// A successful probe lands on a node whose reference is an occurrence of the suffix in
// a stored sequence y.  Extending that occurrence to the left while y agrees with the
// context raises lo at no walking cost (any occurrence of at most D tokens is indexed),
// and the next probe is at least lo + 1.  When the referenced rollout is the one the
// context follows, the second probe already fails and the search is over.
uint32_t SuffixTree::longest_suffix(const Token* context, size_t n, uint32_t cap,
                                    Locus* out) const {
  const uint32_t L = static_cast<uint32_t>(std::min<size_t>(n, cap));
  const Token* back = context + n;  // back[-k]: k-th token from the end
  uint32_t lo = 0, hi = L + 1;  // suffix of length lo is present, of length hi is not
  Locus at{&root_, 0};          // locus of the lo-suffix when `known`
  bool known = true;
  auto probe = [&](uint32_t k) {
    Locus got;
    if (walk(back - k, k, &got) != k) {
      hi = k;
      return false;
    }
    lo = k;
    at = got;
    known = true;
    const Token* y = got.node->ref->tokens.data();
    uint32_t start = got.node->ref_end - got.node->depth;  // the k-suffix is y[start, +k)
    uint32_t e = k;
    while (e + 1 < hi && start > 0 && y[start - 1] == back[-static_cast<ptrdiff_t>(e) - 1]) {
      --start;
      ++e;
    }
    if (e > lo) {
      lo = e;
      known = false;
    }
    return true;
  };
  for (uint32_t k = 1; lo < L && probe(k);) k = std::min(L, std::max(2 * k, lo + 1));
  while (hi - lo > 1) probe(lo + (hi - lo) / 2);
  if (!known && walk(back - lo, lo, &at) != lo) corrupted("extended match not found");
  *out = at;
  return lo;
}

// The locus one token t past `at`, if the tree stores that string.
bool SuffixTree::step(Locus at, Token t, Locus* out) {
  if (at.off < at.node->len) {
    if (label(at.node)[at.off] != t) return false;
    *out = Locus{at.node, at.off + 1};
    return true;
  }
  const Node* c = find_child(at.node, t, nullptr);
  if (!c) return false;
  *out = Locus{c, 1};
  return true;
}

// Every suffix shorter than the present m-suffix is present; the longest whose locus is
// `ok` (monotone in the length, as continuing is); 0 at the root if none.  A walk costs
// its length, so the search gallops up from the shortest (lengths 1, 2, 4, … while ok)
// and bisects the last gap: O(j log j) for an answer j, where a bisection of [0, m) pays
// O(m log m) however short the answer.
template <class Ok>
uint32_t SuffixTree::back_off(const Token* context, size_t n, uint32_t m, Ok ok,
                              Locus* at) const {
  const Token* back = context + n;
  uint32_t lo = 0, hi = m;
  Locus best{&root_, 0};
  auto probe = [&](uint32_t k) {
    Locus got;
    if (walk(back - k, k, &got) != k) corrupted("suffix of a match not found");
    if (!ok(got)) {
      hi = k;
      return false;
    }
    lo = k;
    best = got;
    return true;
  };
  for (uint32_t k = 1; k < hi && probe(k);) k *= 2;
  while (hi - lo > 1) probe(lo + (hi - lo) / 2);
  *at = best;
  return lo;
}

int SuffixTree::draft_into(const Token* context, size_t n, int max_tokens, double min_prob,
                           bool backoff, Token* out, double* probs, int* match_len,
                           int64_t* match_count) const {
  *match_len = 0;
  *match_count = 0;
  const uint32_t b = static_cast<uint32_t>(std::min(max_tokens, max_depth_));
  if (b == 0) return 0;
  // Condition on at most D - b tokens so that b tokens can follow within the depth.
  const uint32_t cap = static_cast<uint32_t>(std::max(max_depth_ - static_cast<int>(b), 1));
  Locus at;
  uint32_t m = longest_suffix(context, n, cap, &at);
  if (backoff && m > 0 && !continues(at)) m = back_off(context, n, m, continues, &at);
  return draft_from(at, m, b, min_prob, out, probs, match_len, match_count);
}

// The draft from the locus `at` of a context suffix of length m (b = min(max_tokens, D)
// >= 1): everything after the suffix search of draft_into.
int SuffixTree::draft_from(Locus at, uint32_t m, uint32_t b, double min_prob, Token* out,
                           double* probs, int* match_len, int64_t* match_count) const {
  *match_len = static_cast<int>(m);
  *match_count = at.node->count;
  if (m == 0) return 0;
  const uint32_t budget = std::min<uint32_t>(b, max_depth_ - m);
  const Node* v = at.node;
  uint32_t off = at.off, len = 0;
  double prob = 1.0;
  while (len < budget) {
    if (off < v->len) {  // inside an edge: the one continuation seen, next_prob(n, n)
      const double p = prob * next_prob(v->count, v->count);
      if (p < min_prob) break;
      prob = p;
      if (probs) probs[len] = prob;
      out[len++] = label(v)[off++];
      continue;
    }
    if (v->nchild == 0) break;
    Node* const* ch = kids(v);
    const Node* best = ch[0];  // children ascend by token: strict '>' keeps the smallest
    for (uint32_t i = 1; i < v->nchild; ++i)
      if (ch[i]->count > best->count) best = ch[i];
    const double p = prob * next_prob(best->count, v->count);
    if (p < min_prob) break;
    prob = p;
    v = best;
    if (probs) probs[len] = prob;  // the child's first token is the one just chosen
    out[len++] = label(v)[0];
    off = 1;
  }
  return static_cast<int>(len);
}

// The hypotheses of the lookahead (feed_and_draft's drafts with the first token branched).
// A continuation not known yet (neither `exclude` nor found) is monotone in the suffix
// length like continuing itself (a shorter suffix occurs wherever a longer one does, with
// every continuation of it), so each next suffix that has one is bisected as in
// draft_into's backoff.
int SuffixTree::branch_points(const Token* context, size_t n, Locus at, uint32_t m,
                              Token exclude, int branches, Branch* out) const {
  const int want = std::min(branches, kMaxBranches);
  uint32_t cnt[kMaxBranches];
  int got = 0;
  auto known = [&](Token t, int upto) {
    if (t == exclude) return true;
    for (int j = 0; j < upto; ++j)
      if (out[j].tok == t) return true;
    return false;
  };
  auto novel = [&](const Locus& l) {
    if (l.off < l.node->len) return !known(label(l.node)[l.off], got);
    for (uint32_t i = 0; i < l.node->nchild; ++i)
      if (!known(l.node->ctok[i], got)) return true;
    return false;
  };
  if (want <= 0) return 0;
  if (m > 0 && !novel(at)) m = back_off(context, n, m, novel, &at);
  double escape = 1.0;  // the chance left to continuations not known: λ / (total + λ) a level
  while (m > 0) {
    // The level's new candidates: the edge's next token, or the node's children not known
    // by count (descending; children ascend by token and a strict '>' keeps the smaller
    // token first); `total` its occurrences continuing with a token not known before it.
    const int first = got;
    uint32_t total = at.node->count;
    if (at.off < at.node->len) {
      out[got] = Branch{label(at.node)[at.off], Locus{at.node, at.off + 1}, 0.0, m};
      cnt[got++] = at.node->count;
    } else {
      Node* const* ch = kids(at.node);
      for (uint32_t i = 0; i < at.node->nchild; ++i) {
        const Token t = at.node->ctok[i];
        const uint32_t c = ch[i]->count;
        if (known(t, first)) {
          total -= c;
          continue;
        }
        int pos = got;
        while (pos > first && cnt[pos - 1] < c) --pos;
        if (pos >= want) continue;
        for (int k = std::min(got, want - 1); k > pos; --k) {
          out[k] = out[k - 1];
          cnt[k] = cnt[k - 1];
        }
        out[pos] = Branch{t, Locus{ch[i], 1}, 0.0, m};
        cnt[pos] = c;
        got = std::min(got + 1, want);
      }
    }
    for (int j = first; j < got; ++j) out[j].share = escape * next_prob(cnt[j], total);
    escape *= prior_ / (static_cast<double>(total) + prior_);
    if (got >= want || escape <= 0.0 || m <= 1) break;
    m = back_off(context, n, m, novel, &at);
  }
  return got;
}

void SuffixTree::path_probs(const Token* context, size_t n, const Token* d, int k,
                            double* q) const {
  if (k <= 0) return;
  Locus at;
  const uint32_t m = longest_suffix(context, n, std::max(max_depth_ - k, 1), &at);
  path_probs_at(at, m, d, k, q);
}

void SuffixTree::path_probs_at(Locus at, uint32_t m, const Token* d, int k, double* q) const {
  std::fill(q, q + std::max(k, 0), 0.0);
  if (k <= 0 || m == 0) return;
  const Node* v = at.node;
  uint32_t off = at.off;
  for (int j = 0; j < k && m + static_cast<uint32_t>(j) < static_cast<uint32_t>(max_depth_);
       ++j) {
    if (off < v->len) {  // inside an edge: the one continuation seen
      if (label(v)[off] != d[j]) return;
      q[j] = next_prob(v->count, v->count);
      ++off;
      continue;
    }
    const Node* c = find_child(v, d[j], nullptr);
    if (!c) return;
    q[j] = next_prob(c->count, v->count);
    v = c;
    off = 1;
  }
}

// draft_into(context, n, max_tokens, min_prob, backoff = true, ...) for a context whose
// tail is the tail of the growing sequence `id` (the batched step's rows), without
// walking from the root.  Returns -1 when it cannot decide; the caller then runs
// draft_into, so the result is always draft_into's.
//
// Why it is the same.  With backoff, draft_into drafts from the locus of the longest
// suffix of length k <= L = min(n, cap) that *continues* (its locus is inside an edge or
// at a node with a child), or from the root with m = 0 when none does: longest_suffix
// finds the longest present suffix m, which is the answer if it continues; otherwise the
// bisection below m finds it, since continuing is monotone in k (if context[-k:] + t
// occurs within the depth limit, so does context[-(k-1):] + t).  The locus of a string is
// unique, so only the length matters.  Now let x be the growing sequence, N = |x|, A =
// |x.active| = min(N, D - 1), and suppose the last c tokens of the context and of x agree.
// For 1 <= k <= min(c, A), the context's k-suffix is x[N - k, N), the string s_{N-k} of x
// (k < D), which ends at the explicit node active[A - k]: its locus, with off == len,
// and it continues iff that node has a child.  Bisecting k over [1, K], K = min(c, A, L),
// gives the longest continuing k* <= K.  If k* < K, suffix k* + 1 <= K does not
// continue, so (monotonicity) no longer one does and k* is the answer.  If k* == K == L
// it is the answer too.  Only k* == K < L (the rest is not known here) returns -1.
int SuffixTree::draft_from_active(SeqId id, const Token* context, size_t n, int max_tokens,
                                  double min_prob, Token* out, double* probs, int* match_len,
                                  int64_t* match_count) const {
  const uint32_t b = static_cast<uint32_t>(std::min(max_tokens, max_depth_));
  if (b == 0) return -1;
  const uint32_t cap = static_cast<uint32_t>(std::max(max_depth_ - static_cast<int>(b), 1));
  const uint32_t L = static_cast<uint32_t>(std::min<size_t>(n, cap));
  const Seq* x = find_seq(id);
  if (!x || !x->growing || L == 0) return -1;
  const uint32_t A = static_cast<uint32_t>(x->active.size());
  const uint32_t N = static_cast<uint32_t>(x->tokens.size());
  const uint32_t lim = std::min(A, L);
  // c: agreeing tail tokens, at most lim (A <= N).
  const Token* cb = context + n;
  const Token* xb = x->tokens.data() + N;
  uint32_t K = 0;
  while (K < lim && cb[-static_cast<ptrdiff_t>(K) - 1] == xb[-static_cast<ptrdiff_t>(K) - 1]) ++K;
  if (K == 0) return -1;
  Node* const* act = x->active.data();  // suffix of length k ends at act[A - k]
  uint32_t lo = 0, hi = K + 1;          // k = lo continues (or lo == 0); k = hi does not
  if (act[A - K]->nchild > 0) {
    lo = K;
  } else {
    hi = K;
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (act[A - mid]->nchild > 0) lo = mid; else hi = mid;
    }
  }
  if (lo == K && K < L) return -1;
  const Locus at = lo ? Locus{act[A - lo], act[A - lo]->len} : Locus{&root_, 0};
  return draft_from(at, lo, b, min_prob, out, probs, match_len, match_count);
}

bool SuffixTree::draft_from_rollout(SeqId id, const std::vector<Token>& context, int max_tokens,
                                    double min_prob, Draft* d) const {
  check_min_prob(min_prob);
  if (max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
  std::shared_lock lock(mu_);
  const size_t keep = std::min<size_t>(context.size(), max_depth_);
  const size_t room = static_cast<size_t>(std::min(max_tokens, max_depth_));
  d->tokens.resize(room);
  d->probs.resize(room);
  const int len = draft_from_active(id, context.data() + (context.size() - keep), keep,
                                    max_tokens, min_prob, d->tokens.data(), d->probs.data(),
                                    &d->match_len, &d->match_count);
  if (len < 0) return false;
  d->tokens.resize(len);
  d->probs.resize(len);
  return true;
}

Draft SuffixTree::draft_unlocked(const std::vector<Token>& context, int max_tokens,
                                 double min_prob, bool backoff) const {
  if (max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
  Draft d;
  const size_t room = static_cast<size_t>(std::min(max_tokens, max_depth_));
  d.tokens.resize(room);
  d.probs.resize(room);
  const int len = draft_into(context.data(), context.size(), max_tokens, min_prob, backoff,
                             d.tokens.data(), d.probs.data(), &d.match_len, &d.match_count);
  d.tokens.resize(len);
  d.probs.resize(len);
  return d;
}

std::pair<int, int64_t> SuffixTree::match(const std::vector<Token>& context) const {
  std::shared_lock lock(mu_);
  Locus at;
  const uint32_t m =
      longest_suffix(context.data(), context.size(), static_cast<uint32_t>(max_depth_), &at);
  return {static_cast<int>(m), at.node->count};
}

int64_t SuffixTree::count(const std::vector<Token>& pattern) const {
  if (pattern.size() > static_cast<size_t>(max_depth_))
    throw std::invalid_argument("patterns longer than max_depth are not indexed");
  std::shared_lock lock(mu_);
  Locus at;
  const uint32_t k = static_cast<uint32_t>(pattern.size());
  return walk(pattern.data(), k, &at) == k ? at.node->count : 0;
}

Draft SuffixTree::draft(const std::vector<Token>& context, int max_tokens,
                        double min_prob, bool backoff) const {
  check_min_prob(min_prob);
  std::shared_lock lock(mu_);
  return draft_unlocked(context, max_tokens, min_prob, backoff);
}

std::vector<Draft> SuffixTree::draft_batch(const std::vector<std::vector<Token>>& contexts,
                                           const std::vector<int>& max_tokens,
                                           double min_prob) const {
  check_min_prob(min_prob);
  if (max_tokens.size() != 1 && max_tokens.size() != contexts.size())
    throw std::invalid_argument("max_tokens: one budget, or one per context");
  std::shared_lock lock(mu_);
  std::vector<Draft> out;
  out.reserve(contexts.size());
  for (size_t i = 0; i < contexts.size(); ++i)
    out.push_back(draft_unlocked(contexts[i], max_tokens[max_tokens.size() == 1 ? 0 : i],
                                 min_prob));
  return out;
}

std::vector<Draft> draft_many(const std::vector<const SuffixTree*>& trees,
                              const std::vector<std::vector<Token>>& contexts,
                              const std::vector<int>& max_tokens, double min_prob,
                              bool backoff) {
  check_min_prob(min_prob);
  if (trees.size() != contexts.size())
    throw std::invalid_argument("one tree per context");
  if (max_tokens.size() != 1 && max_tokens.size() != contexts.size())
    throw std::invalid_argument("max_tokens: one budget, or one per context");
  for (const SuffixTree* t : trees)
    if (!t) throw std::invalid_argument("tree must not be None");
  std::vector<Draft> out;
  out.reserve(contexts.size());
  for (size_t i = 0; i < contexts.size(); ++i) {
    std::shared_lock lock(trees[i]->mu_);
    out.push_back(trees[i]->draft_unlocked(
        contexts[i], max_tokens[max_tokens.size() == 1 ? 0 : i], min_prob, backoff));
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// One drafter step over many rows (see suffix_tree.h).

namespace {

// CPU time of the calling thread: what the step costs the host, not the wait for a
// core on a loaded machine.
int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void bad_row(size_t i, const std::string& what) {
  throw std::invalid_argument("row " + std::to_string(i) + ": " + what);
}

}  // namespace

bool SuffixTree::can_extend(SeqId id) const {
  std::shared_lock lock(mu_);
  const Seq* x = find_seq(id);
  return !x || x->growing;
}

StepTimes feed_and_draft(SuffixTree* const* trees, size_t num_trees, const StepRows& r) {
  // Check everything first, so that bad input changes no tree.
  if (r.width < 0) throw std::invalid_argument("width must be >= 0");
  if (r.rows && r.offsets[0] < 0) bad_row(0, "offsets must start at >= 0");
  for (size_t i = 0; i < r.rows; ++i) {
    if (r.offsets[i + 1] < r.offsets[i]) bad_row(i, "offsets must not decrease");
    const int32_t t = r.tree[i];
    if (t < 0) continue;
    if (static_cast<size_t>(t) >= num_trees || !trees[t])
      bad_row(i, "tree index " + std::to_string(t) + " names no tree");
    if (r.feed && (r.feed[i] < 0 || r.feed[i] > r.offsets[i + 1] - r.offsets[i]))
      bad_row(i, "feed must be in [0, the row's new tokens]");
    if (r.context_len[i] < 0 || r.context_len[i] > r.columns)
      bad_row(i, "context length must be in [0, the context array's columns]");
    if (r.max_tokens[i] < 0) bad_row(i, "max_tokens must be >= 0");
    if (r.max_tokens[i] > 0) {
      if (!(r.min_prob[i] >= 0.0 && r.min_prob[i] <= 1.0))
        bad_row(i, "min_prob must be in [0, 1]");
      if (std::min(r.max_tokens[i], trees[t]->max_depth()) > r.width)
        bad_row(i, "the draft does not fit the output width");
    }
  }
  StepTimes times;
  const int64_t t0 = now_ns();
  // 1. Feed, tree by tree (rows sorted by tree index, stably): one lock per tree.  The
  // order does not change the result: a tree is a function of its sequences.
  std::vector<uint32_t> order;
  order.reserve(r.rows);
  for (size_t i = 0; i < r.rows; ++i) {
    if (r.tree[i] < 0) continue;
    if ((r.feed ? r.feed[i] : r.offsets[i + 1] - r.offsets[i]) > 0)
      order.push_back(static_cast<uint32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return r.tree[a] < r.tree[b]; });
  {
    std::unique_lock<std::shared_mutex> lock;
    const SuffixTree* held = nullptr;
    for (const uint32_t i : order) {
      SuffixTree* t = trees[r.tree[i]];
      if (t != held) {
        lock = std::unique_lock<std::shared_mutex>(t->mu_);
        held = t;
      }
      const int64_t n = r.feed ? r.feed[i] : r.offsets[i + 1] - r.offsets[i];
      try {
        t->extend_unlocked(r.seq[i], r.tokens + r.offsets[i], static_cast<size_t>(n));
      } catch (const std::invalid_argument& err) {
        bad_row(i, err.what());
      }
    }
  }
  const int64_t t1 = now_ns();
  times.feed_ns = t1 - t0;
  // 2. Draft, from the trees as fed.
  {
    std::shared_lock<std::shared_mutex> lock;
    const SuffixTree* held = nullptr;
    for (size_t i = 0; i < r.rows; ++i) {
      r.out_len[i] = 0;
      if (r.tree[i] < 0 || r.max_tokens[i] == 0 || r.context_len[i] == 0) continue;
      const SuffixTree* t = trees[r.tree[i]];
      if (t != held) {
        lock = std::shared_lock<std::shared_mutex>(t->mu_);
        held = t;
      }
      int match_len;
      int64_t match_count;
      const size_t n = static_cast<size_t>(r.context_len[i]);
      const size_t keep = std::min<size_t>(n, t->max_depth());
      const Token* ctx = r.context + static_cast<int64_t>(i) * r.stride + (n - keep);
      Token* out = r.out + static_cast<int64_t>(i) * r.width;
      // The row's context ends with its own growing rollout, whose active list holds the
      // locus of every short suffix: no walks from the root (same result, see above).
      int len = r.backoff ? t->draft_from_active(r.seq[i], ctx, keep, r.max_tokens[i],
                                                 r.min_prob[i], out, nullptr, &match_len,
                                                 &match_count)
                          : -1;
      if (len < 0)
        len = t->draft_into(ctx, keep, r.max_tokens[i], r.min_prob[i], r.backoff, out, nullptr,
                            &match_len, &match_count);
      r.out_len[i] = len;
    }
  }
  times.draft_ns = now_ns() - t1;
  return times;
}

// One thread's share of hypotheses(): its scratch space and the tree it holds (shared).
struct HypothesisWork {
  explicit HypothesisWork(const HypothesisRows& r)
      : out(static_cast<size_t>(r.width)),
        probs(static_cast<size_t>(r.width)),
        slot(static_cast<size_t>(std::max<int32_t>(r.k_max, 1)), 0.0) {}

  // An outcome (a, x) of a row: its chance, its count and its branch (the j-th found).
  struct Outcome {
    double chance;
    int32_t a;
    int32_t j;
    SuffixTree::Branch br;
  };
  // The most likely first; among equals the smaller count, then the more frequent branch.
  static bool more_likely(const Outcome& x, const Outcome& y) {
    if (x.chance != y.chance) return x.chance > y.chance;
    return x.a != y.a ? x.a < y.a : x.j < y.j;
  }

  std::vector<Token> ctx, out;
  std::vector<Outcome> outcomes;
  SuffixTree::Branch br[SuffixTree::kMaxBranches];
  std::vector<double> q, chance_of, probs, slot;
  std::vector<int32_t> order;
  std::vector<SuffixTree::Locus> locus;
  std::vector<uint32_t> suffix;  // per count: its longest suffix's length (+1; 0: none yet)
  std::shared_lock<std::shared_mutex> lock;
  const SuffixTree* held = nullptr;

  // Row i's hypotheses, drafts and slots into r's outputs (row i's cells only).
  void row(SuffixTree* const* trees, const HypothesisRows& r, size_t i);
};

void HypothesisWork::row(SuffixTree* const* trees, const HypothesisRows& r, size_t i) {
  const int32_t B = r.branches, H = r.hypotheses, K = r.k_max;
  int32_t* lengths = r.lengths + static_cast<int64_t>(i) * H;
  int64_t best = -1, fallback = 0;
  if (r.max_tokens[i] > 0 && r.tree[i] >= 0) {
    const SuffixTree* t = trees[r.tree[i]];
    if (t != held) {
      lock = std::shared_lock<std::shared_mutex>(t->mu_);
      held = t;
    }
    const int64_t k = r.sound[i];
    const Token* d = r.verified + static_cast<int64_t>(i) * r.verified_stride;
    const Token* row = r.context + static_cast<int64_t>(i) * r.stride;
    const size_t n = static_cast<size_t>(r.context_len[i]);
    const uint32_t b = static_cast<uint32_t>(
        std::max(0, std::min({r.max_tokens[i], t->max_depth() - 1, r.width - 1})));
    // condition on at most D - b - 1 tokens: the branch and b tokens follow within the depth
    const uint32_t cap = static_cast<uint32_t>(std::max(t->max_depth() - static_cast<int>(b) - 1, 1));
    // the context's longest suffix: count 0's, and path_probs's where neither cap
    // (D - b - 1 here, D - k there) cuts it
    locus.resize(static_cast<size_t>(k + 1));
    suffix.assign(static_cast<size_t>(k + 1), 0);
    SuffixTree::Locus at0;
    const uint32_t m0 = t->longest_suffix(row, n, cap, &at0);
    locus[0] = at0;
    suffix[0] = m0 + 1;
    q.resize(static_cast<size_t>(std::max<int64_t>(k, 1)));
    const int64_t cap_q = std::max<int64_t>(t->max_depth() - k, 1);
    if (m0 < cap && m0 <= cap_q)   // the longest suffix, uncut by either cap
      t->path_probs_at(at0, m0, d, static_cast<int>(k), q.data());
    else
      t->path_probs(row, n, d, static_cast<int>(k), q.data());
    // each count's probability by the tree: the first a drafts, then not d[a] (a < k)
    chance_of.resize(static_cast<size_t>(k + 1));
    double reach = 1.0;              // q_1 … q_a
    for (int64_t a = 0; a <= k; ++a) {
      chance_of[a] = a < k ? reach * (1.0 - q[a]) : reach;
      if (a < k) reach *= q[a];
    }
    // the counts by chance: an outcome's chance is at most its count's, so once H outcomes
    // are at least as likely as a count (strictly more, or more by the order above), none
    // of that count's or a less likely one's can be among the H
    order.resize(static_cast<size_t>(k + 1));
    for (int32_t a = 0; a <= k; ++a) order[a] = a;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return chance_of[x] > chance_of[y]; });
    outcomes.clear();
    for (const int32_t a : order) {
      if (outcomes.size() >= static_cast<size_t>(H)) {
        std::nth_element(outcomes.begin(), outcomes.begin() + (H - 1), outcomes.end(),
                         more_likely);
        const Outcome& last = outcomes[H - 1];
        if (chance_of[a] < last.chance || (chance_of[a] == last.chance && a > last.a)) break;
      }
      const size_t total = n + static_cast<size_t>(a);
      if (total == 0) continue;
      // the last max_depth tokens of context + d[:a]
      const size_t keep = std::min<size_t>(total, static_cast<size_t>(t->max_depth()));
      ctx.resize(keep);
      for (size_t j = 0; j < keep; ++j) {
        const size_t at = total - keep + j;
        ctx[j] = at < n ? row[at] : d[at - n];
      }
      // its longest suffix.  The longest stored suffix of s + t is at most one token
      // longer than s's (a prefix of a stored string is stored), so from the nearest
      // count below whose suffix is known, one step a token while the step exists and
      // the cap allows; else a search
      int32_t p = a;
      while (!suffix[p]) --p;          // suffix[0] is known
      for (; p < a && suffix[p] - 1 < cap && SuffixTree::step(locus[p], d[p], &locus[p + 1]);
           ++p)
        suffix[p + 1] = suffix[p] + 1;
      if (p < a) {
        SuffixTree::Locus got;
        suffix[a] = t->longest_suffix(ctx.data(), keep, cap, &got) + 1;
        locus[a] = got;
      }
      const SuffixTree::Locus at = locus[a];
      const uint32_t m = suffix[a] - 1;
      // a count's branches come most likely first where λ < 1 (a shorter suffix's share
      // is below the escape before it, below the least share of the longer suffix), so
      // no more than H of them can be among the H most likely; for any λ, its first H
      const int got = t->branch_points(ctx.data(), keep, at, m, a < k ? d[a] : -1,
                                       std::min(B, H), br);
      for (int j = 0; j < got; ++j)
        outcomes.push_back(Outcome{chance_of[a] * br[j].share, a, j, br[j]});
    }
    const size_t take = std::min<size_t>(outcomes.size(), static_cast<size_t>(H));
    std::partial_sort(outcomes.begin(), outcomes.begin() + take, outcomes.end(), more_likely);
    for (size_t h = 0; h < take; ++h) {
      const Outcome& o = outcomes[h];
      const int64_t cell = static_cast<int64_t>(i) * H + static_cast<int64_t>(h);
      Token* tok = r.tokens + cell * (K + 1);
      std::copy(d, d + o.a, tok);
      tok[o.a] = o.br.tok;
      lengths[h] = o.a + 1;
      int match_len = 0;
      int64_t match_count = 0;
      const int len = b ? t->draft_from(o.br.next, o.br.m + 1, b, r.min_prob[i], out.data(),
                                        probs.data(), &match_len, &match_count)
                        : 0;
      r.branch_len[cell] = 1 + len;
      const int32_t u_max = std::min<int32_t>(std::max(len, 0), K);
      if (u_max > 0) std::copy(out.data(), out.data() + u_max, r.drafts + cell * K);
      // slot u is accepted under this hypothesis with its chance times the draft's
      // probability of reaching u given it
      for (int32_t u = 0; u < u_max; ++u) slot[u] += o.chance * probs[u];
      // the fallback: the most tokens assumed, the more likely among equals
      const int64_t score = lengths[h] * static_cast<int64_t>(H) - static_cast<int64_t>(h);
      if (score > best) {
        best = score;
        fallback = static_cast<int64_t>(h);
      }
    }
  }
  // the row verifies the slots whose chance of acceptance, summed over its hypotheses
  // (at most one holds), reaches its cutoff; each hypothesis's draft is cut there
  int32_t L = 0;
  while (L < K && slot[L] > 0.0 && slot[L] >= r.min_prob[i]) ++L;
  r.draft_len[i] = L;
  for (int64_t h = 0; h < H; ++h) {   // only drafts longer than L hold tokens past it
    const int64_t cell = static_cast<int64_t>(i) * H + h;
    if (r.branch_len[cell] <= 1 + L) continue;
    Token* draft = r.drafts + cell * K;
    std::fill(draft + L, draft + std::min<int32_t>(r.branch_len[cell] - 1, K), 0);
    r.branch_len[cell] = 1 + L;
  }
  std::fill(slot.begin(), slot.end(), 0.0);
  r.fallback[i] = fallback;
}

int64_t hypotheses(SuffixTree* const* trees, size_t num_trees, const HypothesisRows& r) {
  const int32_t B = r.branches, H = r.hypotheses, K = r.k_max;
  if (B < 1 || B > SuffixTree::kMaxBranches)
    throw std::invalid_argument("branches must be in [1, 16]");
  if (H < 1) throw std::invalid_argument("hypotheses per row must be >= 1");
  if (r.width < 1) throw std::invalid_argument("width must be >= 1");
  if (K < 0) throw std::invalid_argument("k_max must be >= 0");
  if (r.threads < 1) throw std::invalid_argument("threads must be >= 1");
  size_t drafting = 0;
  for (size_t i = 0; i < r.rows; ++i) {
    if (r.max_tokens[i] <= 0) continue;
    if (r.sound[i] < 0 || r.sound[i] > K) bad_row(i, "sound must be in [0, k_max]");
    const int32_t t = r.tree[i];
    if (t < 0) continue;
    if (static_cast<size_t>(t) >= num_trees || !trees[t])
      bad_row(i, "tree index " + std::to_string(t) + " names no tree");
    if (r.context_len[i] < 0 || r.context_len[i] > r.columns)
      bad_row(i, "context length must be in [0, the context array's columns]");
    if (!(r.min_prob[i] >= 0.0 && r.min_prob[i] <= 1.0))
      bad_row(i, "min_prob must be in [0, 1]");
    ++drafting;
  }
  const int64_t cells = static_cast<int64_t>(r.rows) * H;
  std::fill(r.lengths, r.lengths + cells, 0);
  std::fill(r.branch_len, r.branch_len + cells, 0);
  // a hypothesis's tokens are -1 padded (as vLLM pads the sampled ids past a row's
  // tokens); a cell without one starts with -2, which no sampled id equals
  std::fill(r.tokens, r.tokens + cells * (K + 1), -1);
  for (int64_t c = 0; c < cells; ++c) r.tokens[c * (K + 1)] = -2;
  std::fill(r.drafts, r.drafts + cells * K, 0);
  std::fill(r.draft_len, r.draft_len + r.rows, 0);
  // Rows are independent (each writes its own cells; the trees are only read, under
  // their shared locks), so up to r.threads threads take chunks of rows in turn: the
  // same output, in less wall time where the host has idle cores.
  constexpr size_t kChunk = 16;           // rows a thread takes at a time
  constexpr size_t kRowsPerThread = 64;   // fewer drafting rows a thread: not worth one
  const size_t threads = std::min<size_t>(static_cast<size_t>(r.threads),
                                          std::max<size_t>(drafting / kRowsPerThread, 1));
  std::atomic<size_t> next{0};
  std::atomic<int64_t> cpu_ns{0};
  auto run = [&]() {
    const int64_t t0 = now_ns();
    HypothesisWork w(r);
    for (;;) {
      const size_t lo = next.fetch_add(kChunk);
      if (lo >= r.rows) break;
      const size_t hi = std::min(lo + kChunk, r.rows);
      for (size_t i = lo; i < hi; ++i) w.row(trees, r, i);
    }
    cpu_ns += now_ns() - t0;
  };
  if (threads <= 1) {
    run();
    return cpu_ns.load();
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> failed(threads);
  pool.reserve(threads - 1);
  for (size_t j = 1; j < threads; ++j) {
    try {
      pool.emplace_back([&, j]() {
        try {
          run();
        } catch (...) {
          failed[j] = std::current_exception();
          next = r.rows;     // the others stop at their next chunk
        }
      });
    } catch (...) {
      break;               // no thread to be had: the threads started share the rows
    }
  }
  try {
    run();
  } catch (...) {
    failed[0] = std::current_exception();
    next = r.rows;
  }
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
  return cpu_ns.load();
}

int64_t SuffixTree::num_nodes() const {
  std::shared_lock lock(mu_);
  return nodes_;
}

int64_t SuffixTree::num_tokens() const {
  std::shared_lock lock(mu_);
  return root_.count;
}

int64_t SuffixTree::num_sequences() const {
  std::shared_lock lock(mu_);
  return ndir_;
}

bool SuffixTree::contains(SeqId id) const {
  std::shared_lock lock(mu_);
  return find_seq(id) != nullptr;
}

std::vector<SeqId> SuffixTree::sequences() const {
  std::shared_lock lock(mu_);
  std::vector<SeqId> ids(ndir_);
  for (uint32_t i = 0; i < ndir_; ++i) ids[i] = dir_[i].id;
  return ids;
}

std::vector<Token> SuffixTree::sequence(SeqId id) const {
  std::shared_lock lock(mu_);
  return get_seq(id)->tokens;
}

bool SuffixTree::is_growing(SeqId id) const {
  std::shared_lock lock(mu_);
  return get_seq(id)->growing;
}

size_t SuffixTree::memory_bytes() const {
  std::shared_lock lock(mu_);
  return bytes_;
}

// ---------------------------------------------------------------------------------------
// Integrity check (tests and debugging): recomputes everything from scratch.

std::string SuffixTree::check() const {
  std::shared_lock lock(mu_);
  std::unordered_set<const Seq*> live;
  size_t bytes = sizeof(*this) + ceil_pow2(ndir_) * sizeof(DirEntry);
  uint64_t total_tokens = 0;
  for (uint32_t i = 0; i < ndir_; ++i) {
    const Seq* x = dir_[i].seq;
    if (i && dir_[i - 1].id >= dir_[i].id) return "directory not sorted";
    if (x->id != dir_[i].id) return "directory id mismatch";
    live.insert(x);
    total_tokens += x->tokens.size();
    bytes += sizeof(Seq) + x->tokens.capacity() * sizeof(Token) +
             x->slot.capacity() * sizeof(uint32_t) + x->active.capacity() * sizeof(Node*);
    if (x->slot.size() != x->tokens.size()) return "slot size mismatch";
  }
  // P(v) as a pointer into a live sequence; valid once v's reference is checked.
  auto path = [](const Node* v) { return v->ref->tokens.data() + (v->ref_end - v->depth); };
  std::unordered_map<const Seq*, std::vector<char>> seen;
  std::vector<const Node*> stack{&root_};
  int64_t nodes = 0;
  uint64_t ends_total = 0;
  while (!stack.empty()) {
    const Node* v = stack.back();
    stack.pop_back();
    ++nodes;
    bytes += (v == &root_ ? 0 : sizeof(Node)) + child_block_bytes(ceil_pow2(v->nchild)) +
             ceil_pow2(v->nends) * sizeof(EndRef);
    if (v == &root_) {
      if (v->len || v->depth || v->nends || v->parent) return "bad root";
    } else {
      if (!v->count) return "node with zero count";
      if (!v->nends && v->nchild < 2) return "node not canonical (should be merged)";
      if (!v->len || v->depth != v->parent->depth + v->len) return "bad edge length";
      if (v->depth > max_depth_) return "node deeper than max_depth";
      if (!live.count(v->ref)) return "reference to a removed sequence";
      if (v->ref_end < v->depth || v->ref_end > v->ref->tokens.size()) return "bad reference";
      if (v->parent != &root_ &&
          !std::equal(path(v), path(v) + v->parent->depth, path(v->parent)))
        return "reference does not spell the path";
      if (find_child(v->parent, label(v)[0], nullptr) != v) return "child key differs from label";
    }
    uint64_t sum = v->nends;
    for (uint32_t i = 0; i < v->nchild; ++i) {
      const Node* c = kids(v)[i];
      if (i && v->ctok[i - 1] >= v->ctok[i]) return "children not sorted";
      if (c->parent != v) return "bad parent pointer";
      sum += c->count;
      stack.push_back(c);
    }
    if (sum != v->count) return "count != ends + sum of children";
    for (uint32_t i = 0; i < v->nends; ++i) {
      const EndRef& e = v->ends[i];
      if (!live.count(e.seq)) return "ending string of a removed sequence";
      const size_t n = e.seq->tokens.size();
      if (e.start >= n || e.seq->slot[e.start] != i) return "bad slot";
      if (std::min<size_t>(n - e.start, max_depth_) != v->depth)
        return "string ends at the wrong depth";
      if (!std::equal(path(v), path(v) + v->depth, e.seq->tokens.data() + e.start))
        return "ending string does not spell the path";
      std::vector<char>& mark = seen[e.seq];
      mark.resize(n);
      if (mark[e.start]) return "string recorded twice";
      mark[e.start] = 1;
    }
    ends_total += v->nends;
  }
  if (nodes != nodes_) return "node count mismatch";
  if (ends_total != total_tokens || root_.count != total_tokens) return "token count mismatch";
  for (uint32_t i = 0; i < ndir_; ++i) {
    const Seq* x = dir_[i].seq;
    const size_t n = x->tokens.size();
    if (!x->growing) {
      if (!x->active.empty()) return "finished sequence with active strings";
      continue;
    }
    if (x->active.size() != std::min<size_t>(n, max_depth_ - 1)) return "bad active list size";
    for (size_t k = 0; k < x->active.size(); ++k) {
      const size_t j = n - x->active.size() + k;
      const Node* v = x->active[k];
      if (v->depth != n - j || x->slot[j] >= v->nends || v->ends[x->slot[j]].seq != x ||
          v->ends[x->slot[j]].start != j)
        return "active node does not hold its string";
    }
  }
  if (bytes != bytes_) return "memory accounting mismatch";
  return "";
}

}  // namespace vllm_rl
