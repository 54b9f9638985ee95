// A lazy regex automaton over bytes, with token masks computed on demand.
//
// For constraints whose eager index (outlines-core: every DFA state x every token, built up
// front) is too large to build: large JSON schemas, long counted strings. Here the regex
// becomes a byte-level Thompson NFA (UTF-8 classes as byte-range sequences); DFA states are
// sets of NFA states made when first reached; a state's token mask is a walk of the
// vocabulary's byte trie through the DFA, made when first asked for and cached.
//
// Counted repetitions of one character (a class, or a JSON string character with its escapes:
// a string's maxLength) unroll into one NFA unit per character. A mask only sees as far ahead as the longest token, so units that need
// equally many more characters (capped there) and allow equally many more (capped there)
// have the same mask: the cache is keyed by that canonical form, and a 4,096-character string
// costs a handful of walks instead of thousands.
//
// A length lookahead `(?=C{m,n}T)(X)T` (T a character outside the class C) is the one
// lookaround supported: X's strings of m to n characters, all in C. JSON-schema strings with
// both a pattern (or format) and length bounds compile to it. X is laid out once per count
// of characters read so far, each character stepping to the next copy; those copies form a
// counted group too.
//
// Each NFA node knows the fewest bytes from it to the match (over single-byte tokens) and an
// upper bound on the tokens (that path cut into the longest tokens it starts with); a DFA
// state the least over its nodes. A budgeted mask keeps the tokens whose next state can still
// complete in the tokens left after them, so an output near max_tokens closes its document.
//
// Called through ctypes from grammars/regex/lazy.py; every entry point catches C++ exceptions.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------
// Regex syntax: a tree of literals, code-point classes, concatenation, alternation and
// repetition. Python's syntax minus what a finite automaton cannot do (lookarounds,
// backreferences, word boundaries) and minus flags; \d \w \s are their ASCII classes.

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive

struct Ast {
  enum Kind { kEmpty, kClass, kConcat, kAlt, kRepeat, kSpan } kind = kEmpty;
  Ranges ranges;          // kClass; kSpan: the class every character is in
  std::vector<int> kids;  // kConcat, kAlt; kRepeat, kSpan: one
  int min = 0, max = -1;  // kRepeat, kSpan (characters); max -1: unbounded
  int depth = 1;          // of the tree below: parsing and compiling recurse this deep
};

// Parsing and compiling recurse once per level of nesting, on the caller's thread stack;
// deeper regexes are refused (JSON schemas' regexes nest a few hundred levels at most).
constexpr int kMaxNesting = 2000;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

constexpr int kMaxSpanChars = 8191;  // a length lookahead's bounds (they key mask sharing)

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  for (auto [lo, hi] : a) {
    for (auto [blo, bhi] : b) {
      uint32_t l = std::max(lo, blo), h = std::min(hi, bhi);
      if (l <= h) out.push_back({l, h});
    }
  }
  return normalize(out);
}

Ranges negate(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

class Parser {
 public:
  Parser(const std::string& pattern, std::vector<Ast>& pool) : src_(pattern), pool_(pool) {}

  int parse() {
    if (peek_is('^')) ++pos_;  // anchors at the ends match the whole text anyway
    int root = alternation();
    if (pos_ != src_.size()) fail("unbalanced ')'");
    return root;
  }

 private:
  const std::string& src_;
  std::vector<Ast>& pool_;
  size_t pos_ = 0;
  int groups_open_ = 0;

  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(why + " at position " + std::to_string(pos_));
  }
  bool done() const { return pos_ >= src_.size(); }
  bool peek_is(char c) const { return !done() && src_[pos_] == c; }

  int add(Ast node) {
    for (int kid : node.kids) node.depth = std::max(node.depth, pool_[kid].depth + 1);
    if (node.depth > kMaxNesting) fail("the regex nests deeper than 2000 levels");
    pool_.push_back(std::move(node));
    return static_cast<int>(pool_.size()) - 1;
  }
  int cls(Ranges r) {
    Ast a;
    a.kind = Ast::kClass;
    a.ranges = normalize(std::move(r));
    return add(std::move(a));
  }

  uint32_t code_point() {  // the next UTF-8 character of the pattern
    const auto* s = reinterpret_cast<const unsigned char*>(src_.data());
    uint32_t c = s[pos_];
    int extra = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    if (extra) c &= 0x3F >> extra;
    if (pos_ + extra >= src_.size() + (extra ? 0 : 1)) fail("truncated UTF-8 in the pattern");
    for (int i = 1; i <= extra; ++i) c = (c << 6) | (s[pos_ + i] & 0x3F);
    pos_ += 1 + extra;
    return c;
  }

  int alternation() {
    std::vector<int> options{concatenation()};
    while (peek_is('|')) {
      ++pos_;
      options.push_back(concatenation());
    }
    if (options.size() == 1) return options[0];
    Ast a;
    a.kind = Ast::kAlt;
    a.kids = std::move(options);
    return add(std::move(a));
  }

  int concatenation() {
    std::vector<int> parts;
    while (!done() && src_[pos_] != '|' && src_[pos_] != ')') {
      if (src_[pos_] == '$' && pos_ + 1 == src_.size()) {
        ++pos_;  // the end anchor
        continue;
      }
      parts.push_back(repetition(atom()));
    }
    if (parts.size() == 1) return parts[0];
    Ast a;
    a.kind = parts.empty() ? Ast::kEmpty : Ast::kConcat;
    a.kids = std::move(parts);
    return add(std::move(a));
  }

  int number() {
    size_t start = pos_;
    while (!done() && src_[pos_] >= '0' && src_[pos_] <= '9') ++pos_;
    if (pos_ == start) return -1;
    if (pos_ - start > 7) fail("repetition count too large");
    return std::stoi(src_.substr(start, pos_ - start));
  }

  int repetition(int atom_id) {
    while (!done()) {
      int lo, hi;
      char c = src_[pos_];
      if (c == '*') {
        lo = 0, hi = -1, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        size_t save = pos_++;
        lo = number();
        hi = lo;
        if (peek_is(',')) {
          ++pos_;
          hi = number();
          if (lo < 0) lo = 0;
        }
        if (!peek_is('}') || (lo < 0 && hi < 0)) {
          pos_ = save;  // not a repetition: a literal '{', as Python reads it
          return atom_id;
        }
        ++pos_;
        if (hi >= 0 && hi < lo) fail("repetition {m,n} with n < m");
      } else {
        return atom_id;
      }
      if (peek_is('?')) ++pos_;  // lazy: the same language
      else if (peek_is('+')) fail("possessive repetition is not supported");
      Ast a;
      a.kind = Ast::kRepeat;
      a.kids = {atom_id};
      a.min = lo;
      a.max = hi;
      atom_id = add(std::move(a));
    }
    return atom_id;
  }

  // After `(?=`: C{m,n}T) then the group (X) and T, which stays for the caller to read.
  int span() {
    const char* shape = "a lookahead other than (?=C{m,n}T)(X)T, T outside the class C";
    if (done()) fail(shape);
    int cls_id = atom();
    int rep = repetition(cls_id);
    if (pool_[cls_id].kind != Ast::kClass || pool_[rep].kind != Ast::kRepeat ||
        pool_[rep].kids[0] != cls_id || done()) {
      fail(shape);
    }
    int lo = pool_[rep].min, hi = pool_[rep].max;
    if (lo > kMaxSpanChars || hi > kMaxSpanChars) fail("a length lookahead above 8191 characters");
    uint32_t end = code_point();
    if (!peek_is(')')) fail(shape);
    ++pos_;
    const Ranges& chars = pool_[cls_id].ranges;
    bool end_in_class = std::any_of(chars.begin(), chars.end(),
                                    [end](auto r) { return r.first <= end && end <= r.second; });
    if (end_in_class || !peek_is('(')) fail(shape);
    int body = atom();
    size_t after = pos_;
    if (done() || code_point() != end) fail(shape);
    pos_ = after;
    Ast a;
    a.kind = Ast::kSpan;
    a.ranges = chars;
    a.kids = {body};
    a.min = lo;
    a.max = hi;
    return add(std::move(a));
  }

  int atom() {
    char c = src_[pos_];
    if (c == '(') {
      if (++groups_open_ > kMaxNesting) fail("the regex nests deeper than 2000 levels");
      ++pos_;
      if (peek_is('?')) {
        ++pos_;
        if (peek_is(':')) {
          ++pos_;
        } else if (peek_is('P') && pos_ + 1 < src_.size() && src_[pos_ + 1] == '<') {
          size_t close = src_.find('>', pos_);
          if (close == std::string::npos) fail("unterminated group name");
          pos_ = close + 1;
        } else if (peek_is('=')) {
          ++pos_;
          --groups_open_;  // span() reads the lookahead's closing parenthesis itself
          return span();
        } else {
          fail("group flags, lookarounds and named references are not supported");
        }
      }
      int inner = alternation();
      if (!peek_is(')')) fail("missing ')'");
      ++pos_;
      --groups_open_;
      return inner;
    }
    if (c == '[') return bracket();
    if (c == '.') {
      ++pos_;
      return cls({{0, '\n' - 1}, {'\n' + 1, kMaxCodePoint}});
    }
    if (c == '\\') return cls(escape(false));
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == '^' || c == '$') fail("'^' and '$' are supported only at the ends");
    uint32_t cp = code_point();
    return cls({{cp, cp}});
  }

  // An escape after '\': a class (\d, \w, \s and negations) or one character.
  Ranges escape(bool in_bracket) {
    ++pos_;
    if (done()) fail("trailing backslash");
    char c = src_[pos_];
    const Ranges digit{{'0', '9'}};
    const Ranges word{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const Ranges space{{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd': ++pos_; return digit;
      case 'D': ++pos_; return negate(digit);
      case 'w': ++pos_; return word;
      case 'W': ++pos_; return negate(word);
      case 's': ++pos_; return space;
      case 'S': ++pos_; return negate(space);
      case 'n': ++pos_; return {{'\n', '\n'}};
      case 't': ++pos_; return {{'\t', '\t'}};
      case 'r': ++pos_; return {{'\r', '\r'}};
      case 'f': ++pos_; return {{'\f', '\f'}};
      case 'v': ++pos_; return {{'\v', '\v'}};
      case 'a': ++pos_; return {{7, 7}};
      case '0': ++pos_; return {{0, 0}};
      case 'x': return {hex_escape(2)};
      case 'u': return {hex_escape(4)};
      case 'U': return {hex_escape(8)};
      case 'b':
        if (in_bracket) {
          ++pos_;
          return {{8, 8}};
        }
        fail("word boundaries are not supported");
      case 'B': case 'A': case 'Z': case 'z': case 'G':
        fail("anchors other than '^' and '$' are not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          fail(std::string("unknown escape \\") + c);
        }
        uint32_t cp = code_point();
        return {{cp, cp}};
    }
  }

  std::pair<uint32_t, uint32_t> hex_escape(int digits) {
    ++pos_;
    if (pos_ + digits > src_.size()) fail("truncated \\x, \\u or \\U escape");
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char h = src_[pos_++];
      int d = h >= '0' && h <= '9' ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) fail("bad hex digit in an escape");
      v = v * 16 + d;
    }
    if (v > kMaxCodePoint) fail("code point out of range");
    return {v, v};
  }

  int bracket() {
    ++pos_;
    bool negated = peek_is('^');
    if (negated) ++pos_;
    Ranges r;
    bool first = true;
    while (true) {
      if (done()) fail("unterminated character class");
      char c = src_[pos_];
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      Ranges item;
      if (c == '\\') {
        item = escape(true);
      } else if (c == '[' && pos_ + 1 < src_.size() && src_[pos_ + 1] == ':') {
        fail("POSIX classes are not supported");
      } else {
        uint32_t cp = code_point();
        item = {{cp, cp}};
      }
      // A range a-b: both ends single characters, '-' not last.
      if (item.size() == 1 && item[0].first == item[0].second && peek_is('-') &&
          pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
        ++pos_;
        Ranges end = src_[pos_] == '\\' ? escape(true) : Ranges{};
        if (end.empty()) {
          uint32_t cp = code_point();
          end = {{cp, cp}};
        }
        if (end.size() != 1 || end[0].first != end[0].second) fail("bad range in a class");
        if (end[0].first < item[0].first) fail("reversed range in a class");
        item = {{item[0].first, end[0].first}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    r = normalize(std::move(r));
    return cls(negated ? negate(r) : r);
  }
};

// ---------------------------------------------------------------------------------------
// UTF-8: a code-point range as sequences of byte ranges (each sequence a product of ranges).

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

int utf8_encode(uint32_t c, uint8_t* out) {
  if (c < 0x80) {
    out[0] = c;
    return 1;
  }
  if (c < 0x800) {
    out[0] = 0xC0 | (c >> 6), out[1] = 0x80 | (c & 0x3F);
    return 2;
  }
  if (c < 0x10000) {
    out[0] = 0xE0 | (c >> 12), out[1] = 0x80 | ((c >> 6) & 0x3F), out[2] = 0x80 | (c & 0x3F);
    return 3;
  }
  out[0] = 0xF0 | (c >> 18), out[1] = 0x80 | ((c >> 12) & 0x3F);
  out[2] = 0x80 | ((c >> 6) & 0x3F), out[3] = 0x80 | (c & 0x3F);
  return 4;
}

void utf8_split(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  // Ranges crossing an encoded-length boundary or the surrogates are cut there first.
  static const uint32_t kCuts[] = {0x7F, 0x7FF, 0xD7FF, 0xDFFF, 0xFFFF};
  for (uint32_t cut : kCuts) {
    if (lo <= cut && cut < hi) {
      utf8_split(lo, cut, out);
      utf8_split(cut + 1, hi, out);
      return;
    }
  }
  if (lo >= 0xD800 && hi <= 0xDFFF) return;  // surrogates have no UTF-8
  uint8_t a[4], b[4];
  int n = utf8_encode(lo, a);
  // Cut where the continuation bytes below some position do not span their whole range.
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, out);
        utf8_split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, out);
        utf8_split(hi & ~m, hi, out);
        return;
      }
    }
  }
  utf8_encode(hi, b);
  ByteSeq seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

// ---------------------------------------------------------------------------------------
// The NFA: byte-range and byte-set steps and epsilon splits, built backwards (each piece
// compiled with the node it continues to). Nodes that cannot reach the match are dropped
// from DFA states.

constexpr int kMaxNfaNodes = 8'000'000;
constexpr int kCountedUnits = 16;  // class repetitions allowing more are tagged by unit

struct NfaNode {
  enum Kind : uint8_t { kByte, kSplit, kMatch, kSet } kind;
  uint8_t lo = 0, hi = 0;  // kByte: the bytes lo..hi; kSet: lo | hi << 8 indexes Nfa::sets
  int a = -1, b = -1;      // kByte, kSet: a = next; kSplit: a, b (b may be -1)
};

using ByteSet = std::array<uint64_t, 4>;
constexpr size_t kMaxByteSets = 1 << 16;
bool has(const ByteSet& set, int byte) { return set[byte >> 6] >> (byte & 63) & 1; }

// A counted class repetition or a length lookahead's copies: `units` equal units of `size`
// nodes from `base`, unit u entered when `need[u]` more characters are required and
// `room[u]` more allowed.
struct Counted {
  int base, size, units;
  std::vector<int> need, room;
  bool span = false;  // a lookahead's copies of X (masks shared more carefully: canonical)
  int finish = 0;     // span: the most characters any node of X needs to reach X's end
};

constexpr size_t kMaxGroups = 1 << 17;  // group ids and unit offsets key mask sharing
constexpr int kMaxUnitSize = 1 << 20;

class Nfa {
 public:
  std::vector<NfaNode> nodes;
  std::vector<ByteSet> sets;  // kSet nodes' bytes
  std::vector<int> live;     // 1: the match is reachable
  std::vector<int> counted;  // node -> index into groups, or -1
  std::vector<Counted> groups;
  int start = -1;

  static bool steps(const NfaNode& n) { return n.kind == NfaNode::kByte || n.kind == NfaNode::kSet; }
  // Whether the step node n takes `byte`.
  bool takes(const NfaNode& n, int byte) const {
    if (n.kind == NfaNode::kByte) return n.lo <= byte && byte <= n.hi;
    return n.kind == NfaNode::kSet && has(sets[n.lo | n.hi << 8], byte);
  }

  Nfa(const std::vector<Ast>& ast, int root) : ast_(ast) {
    int match = node({NfaNode::kMatch});
    start = compile(root, match);
    counted.resize(nodes.size(), -1);
    for (size_t g = 0; g < groups.size(); ++g) {
      const Counted& c = groups[g];
      std::fill(counted.begin() + c.base, counted.begin() + c.base + c.units * c.size, g);
    }
    mark_live(match);
  }

 private:
  const std::vector<Ast>& ast_;

  int node(NfaNode n) {
    if (nodes.size() >= kMaxNfaNodes) throw std::runtime_error("the regex's automaton is too large");
    nodes.push_back(n);
    return static_cast<int>(nodes.size()) - 1;
  }
  int split(int a, int b) { return node({NfaNode::kSplit, 0, 0, a, b}); }

  int compile(int id, int next) {
    const Ast& a = ast_[id];
    switch (a.kind) {
      case Ast::kEmpty:
        return next;
      case Ast::kClass:
        return char_class(a.ranges, next);
      case Ast::kConcat: {
        for (auto it = a.kids.rbegin(); it != a.kids.rend(); ++it) next = compile(*it, next);
        return next;
      }
      case Ast::kAlt: {
        int start = compile(a.kids.back(), next);
        for (int i = static_cast<int>(a.kids.size()) - 2; i >= 0; --i) {
          start = split(compile(a.kids[i], next), start);
        }
        return start;
      }
      case Ast::kRepeat:
        return repeat(a, next);
      case Ast::kSpan:
        return span(a, next);
    }
    return next;
  }

  // Inside a length lookahead's copy of X: classes keep only the lookahead's characters,
  // and a character steps to the next copy (the copy built before this one).
  const Ranges* span_chars_ = nullptr;
  int span_size_ = 0;   // nodes per copy
  int span_last_ = 0;   // 1: this copy counts the most characters; 2: and loops (no max)

  int span(const Ast& a, int next) {
    if (span_chars_ != nullptr) throw std::runtime_error("nested length lookaheads");
    bool unbounded = a.max < 0;
    int units = (unbounded ? a.min : a.max) + 1;
    Counted g{static_cast<int>(nodes.size()), 0, units, {}, {}, true};
    span_chars_ = &a.ranges;
    int entry = -1;
    for (int k = 0; k < units; ++k) {  // copy k has read units - 1 - k characters
      int count = units - 1 - k;
      span_last_ = k > 0 ? 0 : unbounded ? 2 : 1;
      int exit = node({NfaNode::kSplit, 0, 0, count >= a.min ? next : -1, -1});
      entry = compile(a.kids[0], exit);
      int size = static_cast<int>(nodes.size()) - g.base;
      if (k == 0) span_size_ = size;
      if (size != (k + 1) * span_size_) throw std::logic_error("uneven lookahead copies");
      g.need.push_back(std::max(a.min - count, 0));
      g.room.push_back(unbounded ? INT32_MAX : a.max - count);
    }
    span_chars_ = nullptr;
    g.size = span_size_;
    if (units > 1) g.finish = longest_finish(g.base + g.size, g.size);
    add_group(std::move(g));
    return entry;
  }

  // Over the copy of X at `base` (not the last copy: its characters step to the copy at
  // base - size): the largest, over nodes that can end X, of the fewest characters to its
  // end (the copy's first node, its exit). A 0-1 breadth-first search backwards from it.
  int longest_finish(int base, int size) const {
    std::vector<std::vector<std::pair<int, int>>> preds(size);  // offset -> (offset, chars)
    for (int o = 0; o < size; ++o) {
      const NfaNode& n = nodes[base + o];
      for (int t : {n.a, n.b}) {
        if (t >= base && t < base + size) preds[t - base].push_back({o, 0});
        else if (steps(n) && t >= base - size && t < base) preds[t - base + size].push_back({o, 1});
      }
    }
    std::vector<int> dist(size, INT32_MAX);
    std::vector<int> todo{0}, later;
    dist[0] = 0;
    int longest = 0;
    for (int d = 0; !todo.empty(); ++d, todo.swap(later), later.clear()) {
      while (!todo.empty()) {
        int o = todo.back();
        todo.pop_back();
        if (dist[o] != d) continue;
        longest = d;
        for (auto [p, w] : preds[o]) {
          if (d + w < dist[p]) {
            dist[p] = d + w;
            (w ? later : todo).push_back(p);
          }
        }
      }
    }
    return longest;
  }

  void add_group(Counted g) {
    if (groups.size() < kMaxGroups && g.size < kMaxUnitSize) groups.push_back(std::move(g));
  }

  int char_class(const Ranges& ranges, int next) {
    std::vector<ByteSeq> seqs;
    for (auto [lo, hi] : span_chars_ ? intersect(ranges, *span_chars_) : ranges) {
      utf8_split(lo, hi, seqs);
    }
    if (seqs.empty()) throw std::runtime_error("a character class matches nothing");
    if (span_chars_ != nullptr) next = span_last_ == 1 ? -1 : span_last_ == 2 ? next : next - span_size_;
    // The class's single bytes in one set node where they are several ranges (JSON's
    // whitespace [ \n\t] is two, a string's ASCII characters three): a node a range and a
    // split between each cost a large schema millions of nodes.
    ByteSet single{};
    int singles = 0;
    for (const ByteSeq& seq : seqs) {
      if (seq.size() != 1) continue;
      for (int b = seq[0].first; b <= seq[0].second; ++b) single[b >> 6] |= uint64_t{1} << (b & 63);
      ++singles;
    }
    bool as_set = singles > 1 && (set_ids_.count(single) || sets.size() < kMaxByteSets);
    int start = -1;
    if (as_set) start = node({NfaNode::kSet, 0, 0, next, -1}), set_of(nodes[start], single);
    for (auto it = seqs.rbegin(); it != seqs.rend(); ++it) {
      if (as_set && it->size() == 1) continue;
      int cur = next;
      for (auto b = it->rbegin(); b != it->rend(); ++b) {
        cur = node({NfaNode::kByte, b->first, b->second, cur, -1});
      }
      start = start < 0 ? cur : split(cur, start);
    }
    return start;
  }

  std::map<ByteSet, int> set_ids_;
  void set_of(NfaNode& n, const ByteSet& set) {
    auto [it, added] = set_ids_.emplace(set, static_cast<int>(sets.size()));
    if (added) sets.push_back(set);
    n.lo = it->second & 0xFF, n.hi = it->second >> 8;
  }

  int repeat(const Ast& a, int next) {
    int body = a.kids[0];
    bool counted_class = one_character(body) && span_chars_ == nullptr &&
                         (a.max > kCountedUnits || a.min > kCountedUnits);
    int cur = next;
    if (a.max < 0) {  // X{m,}: the loop, then m copies before it
      int loop = split(-1, next);
      nodes[loop].a = compile(body, loop);
      cur = loop;
    }
    int optional = a.max < 0 ? 0 : a.max - a.min;
    int total = optional + a.min;
    if (!counted_class) {
      for (int j = 0; j < optional; ++j) cur = split(compile(body, cur), next);
      for (int i = 0; i < a.min; ++i) cur = compile(body, cur);
      return cur;
    }
    // Units laid out contiguously, each an entry node then the body: the last character's
    // unit is built first. Unit u is entered after total - 1 - u characters.
    Counted g{static_cast<int>(nodes.size()), 0, total, {}, {}};
    for (int u = 0; u < total; ++u) {
      int entry = node({NfaNode::kSplit});
      int body_start = compile(body, cur);
      nodes[entry].a = body_start;
      nodes[entry].b = u < optional ? next : -1;
      if (u == 0) g.size = static_cast<int>(nodes.size()) - g.base;
      int done_chars = total - 1 - u;
      g.need.push_back(std::max(a.min - done_chars, 0));
      g.room.push_back(a.max < 0 ? INT32_MAX : a.max - done_chars);
      cur = entry;
    }
    add_group(std::move(g));
    return cur;
  }

  // A body that reads one string character per match, laid out as the same nodes in every
  // unit: a class, or alternatives and sequences of classes (a JSON string character with
  // its escapes). Nothing in it matches empty or nests a counted group.
  bool one_character(int id) const {
    const Ast& a = ast_[id];
    if (a.kind == Ast::kClass) return true;
    if ((a.kind != Ast::kAlt && a.kind != Ast::kConcat) || a.kids.empty()) return false;
    return std::all_of(a.kids.begin(), a.kids.end(), [&](int k) { return one_character(k); });
  }

  // Predecessor lists as one array (a list per node cost an allocation each: seconds for the
  // millions of nodes of a large schema): node i's are preds[first[i]] to preds[first[i+1]).
  void predecessors(std::vector<int>& first, std::vector<int>& preds) const {
    size_t n = nodes.size();
    first.assign(n + 1, 0);
    for (const NfaNode& node : nodes) {
      if (node.a >= 0) ++first[node.a + 1];
      if (node.b >= 0) ++first[node.b + 1];
    }
    for (size_t i = 0; i < n; ++i) first[i + 1] += first[i];
    preds.resize(first[n]);
    std::vector<int> fill(first.begin(), first.end() - 1);
    for (size_t i = 0; i < n; ++i) {
      if (nodes[i].a >= 0) preds[fill[nodes[i].a]++] = static_cast<int>(i);
      if (nodes[i].b >= 0) preds[fill[nodes[i].b]++] = static_cast<int>(i);
    }
  }

  void mark_live(int match) {
    std::vector<int> first, preds;
    predecessors(first, preds);
    live.assign(nodes.size(), 0);
    std::vector<int> todo{match};
    live[match] = 1;
    while (!todo.empty()) {
      int node = todo.back();
      todo.pop_back();
      for (int i = first[node]; i < first[node + 1]; ++i) {
        int p = preds[i];
        if (!live[p]) live[p] = 1, todo.push_back(p);
      }
    }
  }

 public:
  // Per node, the fewest bytes from it to the match over byte steps whose range holds a
  // byte in `spellable` (kNever where none leads there): a 0-1 breadth-first search
  // backwards from the match, byte steps costing 1 and splits 0. With every byte spellable
  // it is the exact shortest completion in bytes; otherwise, in single-byte tokens, an
  // upper bound on the tokens a completion needs.
  static constexpr int kNever = INT32_MAX;
  std::vector<int> shortest_completions(const std::vector<uint8_t>& spellable) const {
    std::vector<int> first, preds;
    predecessors(first, preds);
    std::vector<int> dist(nodes.size(), kNever);
    std::vector<uint8_t> set_spellable(sets.size(), 0);
    for (size_t i = 0; i < sets.size(); ++i) {
      for (int b = 0; b < 256; ++b) set_spellable[i] |= spellable[b] && has(sets[i], b);
    }
    std::vector<int> todo{0}, later;  // node 0 is the match (made first)
    dist[0] = 0;
    for (int d = 0; !todo.empty(); ++d, todo.swap(later), later.clear()) {
      while (!todo.empty()) {
        int n = todo.back();
        todo.pop_back();
        if (dist[n] != d) continue;
        for (int i = first[n]; i < first[n + 1]; ++i) {
          int p = preds[i];
          const NfaNode& pn = nodes[p];
          int w = 0;
          if (steps(pn)) {
            bool any = pn.kind == NfaNode::kSet && set_spellable[pn.lo | pn.hi << 8];
            for (int b = pn.lo; pn.kind == NfaNode::kByte && b <= pn.hi && !any; ++b) any = spellable[b];
            if (!any) continue;
            w = 1;
          }
          if (d + w < dist[p]) {
            dist[p] = d + w;
            (w ? later : todo).push_back(p);
          }
        }
      }
    }
    return dist;
  }
};

// ---------------------------------------------------------------------------------------
// The vocabulary: token bytes and a byte trie of them. Tokens of plain JSON-string bytes only
// (printable ASCII but '"' and '\') are also kept as a ready mask, with a second trie of
// the others: in a state that loops on every plain byte (inside a free string) those tokens
// are all allowed, and only the rest need a walk.

struct Trie {
  std::vector<int> child_start{0}, token_start{0};  // per node: ranges into the arrays below
  std::vector<uint8_t> child_byte;
  std::vector<int> child_node, tokens;
};

bool plain_byte(uint8_t b) { return b >= 0x20 && b < 0x7F && b != '"' && b != '\\'; }

struct Vocab {
  int size = 0, words = 0, max_len = 0;
  std::vector<std::string> bytes;  // empty: never allowed (special tokens)
  Trie all, special;
  std::vector<std::vector<uint32_t>> plain_upto;  // [k]: plain tokens of at most k bytes
  std::vector<uint8_t> single_byte = std::vector<uint8_t>(256, 0);  // [b]: a token is b alone

  Trie build_trie(const std::vector<int>& ids) const {
    // Sorted by bytes, the tokens spell a trie in depth-first order.
    std::vector<int> order(ids);
    std::sort(order.begin(), order.end(), [&](int x, int y) { return bytes[x] < bytes[y]; });
    struct Tmp { std::vector<std::pair<uint8_t, int>> kids; std::vector<int> toks; };
    std::vector<Tmp> tmp(1);
    for (int id : order) {
      int n = 0;
      for (unsigned char b : bytes[id]) {
        auto& kids = tmp[n].kids;
        if (kids.empty() || kids.back().first != b) {
          kids.push_back({b, static_cast<int>(tmp.size())});
          tmp.emplace_back();
        }
        n = tmp[n].kids.back().second;
      }
      tmp[n].toks.push_back(id);
    }
    Trie t;
    for (const Tmp& n : tmp) {
      for (auto [b, c] : n.kids) t.child_byte.push_back(b), t.child_node.push_back(c);
      t.child_start.push_back(t.child_byte.size());
      t.tokens.insert(t.tokens.end(), n.toks.begin(), n.toks.end());
      t.token_start.push_back(t.tokens.size());
    }
    return t;
  }

  Vocab(int n, const char* data, const int64_t* offsets) : size(n), words((n + 31) / 32) {
    bytes.resize(n);
    std::vector<int> with_bytes, others;
    for (int i = 0; i < n; ++i) {
      bytes[i].assign(data + offsets[i], offsets[i + 1] - offsets[i]);
      max_len = std::max<int>(max_len, bytes[i].size());
      if (bytes[i].size() == 1) single_byte[static_cast<uint8_t>(bytes[i][0])] = 1;
    }
    plain_upto.assign(max_len + 1, std::vector<uint32_t>(words, 0));
    for (int i = 0; i < n; ++i) {
      if (bytes[i].empty()) continue;
      with_bytes.push_back(i);
      bool plain = std::all_of(bytes[i].begin(), bytes[i].end(),
                               [](char c) { return plain_byte(static_cast<uint8_t>(c)); });
      if (!plain) {
        others.push_back(i);
        continue;
      }
      for (size_t k = bytes[i].size(); k <= static_cast<size_t>(max_len); ++k) {
        plain_upto[k][i / 32] |= 1u << (i % 32);
      }
    }
    all = build_trie(with_bytes);
    special = build_trie(others);
  }
};

// ---------------------------------------------------------------------------------------
// The lazy DFA and its masks.

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return h;
  }
};

constexpr int kUnknown = -2, kDead = -1;

// The DFA's states reached their memory budget; the caller may start a fresh automaton.
struct Exhausted : std::runtime_error {
  using std::runtime_error::runtime_error;
};
constexpr size_t kMaxTransitionTables = 200'000;  // 1 KB each; dropped (recomputable) past it
constexpr size_t kMaxMasks = 16'384;              // V / 8 bytes each; dropped past it

class Grammar {
 public:
  // States cannot be dropped like tables and masks (matchers hold their ids), so their
  // memory has a budget: a regex whose DFA outgrows it (exponential blow-up) fails with an
  // error instead of taking the process's memory.
  Grammar(const Vocab& vocab, const std::string& pattern, size_t max_state_bytes)
      : vocab_(vocab), nfa_(parse(pattern)), max_state_bytes_(max_state_bytes) {
    bytes_left_ = nfa_.shortest_completions(vocab.single_byte);
    for (size_t n = 0; n < bytes_left_.size(); ++n) {
      if (nfa_.live[n] && bytes_left_[n] != Nfa::kNever) longest_ = std::max(longest_, bytes_left_[n]);
    }
    start_ = state_of(closure({nfa_.start}));
  }

  std::mutex mutex;
  int start() const { return start_; }
  int num_states() const { return static_cast<int>(states_.size()); }
  int num_masks() const { return static_cast<int>(masks_.size()); }
  int num_nfa_nodes() const { return static_cast<int>(nfa_.nodes.size()); }
  size_t state_bytes() const { return state_bytes_; }
  int vocab_words() const { return vocab_.words; }

  bool is_final(int s) const { return states_[s].final; }

  // An upper bound on the tokens that complete the text from state s (Nfa::kNever where
  // single-byte tokens cannot complete it): tokens_left(n) of its best node.
  int shortest(int s) const { return states_[s].shortest; }

  // The tokens t of s's mask whose next state completes within `budget` - 1 more tokens,
  // into out; returns whether that removed any token of the plain mask (the text was
  // steered). Where no token lets s complete within `budget`, out is the plain mask.
  bool budget_mask(int s, int64_t budget, uint32_t* out) {
    const size_t bytes = vocab_.words * sizeof(uint32_t);
    // Steering is needed only where some token leads to a state needing more than what is
    // left after it: never past the longest shortest completion of any node, nor past
    // the longest among s's next states once a walk found it.
    int64_t after = budget - 1;
    if (after < 0 || after >= longest_ || after >= states_[s].reach) {  // < 0: no room at all
      std::memcpy(out, mask(s).data(), bytes);
      return false;
    }
    int64_t key = static_cast<int64_t>(s) << 32 | after;
    auto it = budget_index_.find(key);
    if (it == budget_index_.end() || it->second.epoch != epoch_) {
      if (masks_.size() >= kMaxMasks) forget_masks();
      int reach = 0;
      masks_.push_back(budget_walk(s, after, &reach));
      states_[s].reach = reach;
      it = budget_index_.insert_or_assign(key, Budgeted{static_cast<int>(masks_.size()) - 1, epoch_}).first;
    }
    const std::vector<uint32_t>& kept = masks_[it->second.mask];
    bool none = std::all_of(kept.begin(), kept.end(), [](uint32_t w) { return w == 0; });
    if (none && !is_final(s)) {  // too late to close: the plain mask
      std::memcpy(out, mask(s).data(), bytes);
      return false;
    }
    std::memcpy(out, kept.data(), bytes);
    return after < states_[s].reach;  // some token of the plain mask went
  }

  int step(int s, uint8_t byte) {
    State& st = states_[s];
    if (st.trans.empty()) {
      if (tables_ >= kMaxTransitionTables) drop_tables();
      states_[s].trans.assign(256, kUnknown);
      ++tables_;
    }
    int t = states_[s].trans[byte];
    if (t != kUnknown) return t;
    std::vector<int> seeds;
    for (int n : states_[s].nfa) {
      const NfaNode& node = nfa_.nodes[n];
      if (nfa_.takes(node, byte)) seeds.push_back(node.a);
    }
    t = seeds.empty() ? kDead : state_of(closure(seeds));
    states_[s].trans[byte] = t;  // states_ may have grown: index again
    return t;
  }

  int advance(int s, const std::string& data) {
    for (unsigned char b : data) {
      s = step(s, b);
      if (s < 0) return kDead;
    }
    return s;
  }

  // The mask of state s (cached by canonical form); returns its index in masks_.
  const std::vector<uint32_t>& mask(int s) {
    if (states_[s].mask >= 0 && states_[s].mask_epoch == epoch_) return masks_[states_[s].mask];
    std::vector<int64_t> key = canonical(s);
    auto it = mask_index_.find(key);
    int id;
    if (it != mask_index_.end()) {
      id = it->second;
    } else {
      if (masks_.size() >= kMaxMasks) forget_masks();
      id = static_cast<int>(masks_.size());
      masks_.push_back(walk(s));
      mask_index_.emplace(std::move(key), id);
    }
    states_[s].mask = id;
    states_[s].mask_epoch = epoch_;
    return masks_[id];
  }

  // Bytes every continuation of s starts with, while s cannot end: jump-forward's text.
  std::string forced(int s, int limit, int* end) {
    std::string out;
    while (static_cast<int>(out.size()) < limit && !states_[s].final) {
      int only = -1, next = kDead;
      for (int b = 0; b < 256; ++b) {
        int t = step(s, static_cast<uint8_t>(b));
        if (t < 0) continue;
        if (only >= 0) {
          only = -2;
          break;
        }
        only = b, next = t;
      }
      if (only < 0) break;
      out.push_back(static_cast<char>(only));
      s = next;
    }
    *end = s;
    return out;
  }

 private:
  struct State {
    std::vector<int> nfa;  // sorted NFA nodes: byte steps and the match, all live
    std::vector<int> trans;
    bool final = false;
    int mask = -1;
    int mask_epoch = -1;
    int shortest = Nfa::kNever;  // the least of its nodes' shortest completions
    int reach = INT32_MAX;  // the most of its next states' (once a budgeted walk found it)
  };
  struct Budgeted {
    int mask, epoch;
  };

  const Vocab& vocab_;
  Nfa nfa_;
  std::vector<State> states_;
  std::unordered_map<std::vector<int64_t>, int, VecHash> index_, mask_index_;
  std::vector<std::vector<uint32_t>> masks_;
  std::unordered_map<int64_t, Budgeted> budget_index_;  // (state, tokens after) -> mask
  std::vector<int> bytes_left_;  // per NFA node (Nfa::shortest_completions)
  int longest_ = 0;  // the most of bytes_left_ over live nodes that complete (bounds tokens too)
  std::unordered_map<int, int> tokens_left_, next_on_path_;  // per NFA node, once asked
  static constexpr size_t kPathEntryBytes = 40;  // an entry of those maps, counted as states'

  size_t tables_ = 0;
  int epoch_ = 0;
  int start_ = kDead;
  size_t max_state_bytes_;
  size_t state_bytes_ = 0;
  std::vector<int> mark_;  // closure scratch: node -> generation
  int generation_ = 0;

  static Nfa parse(const std::string& pattern) {
    std::vector<Ast> pool;
    Parser parser(pattern, pool);
    int root = parser.parse();
    return Nfa(pool, root);
  }

  std::vector<int> closure(const std::vector<int>& seeds) {
    if (mark_.size() != nfa_.nodes.size()) mark_.assign(nfa_.nodes.size(), 0);
    ++generation_;
    std::vector<int> out, todo(seeds);
    while (!todo.empty()) {
      int n = todo.back();
      todo.pop_back();
      if (n < 0 || mark_[n] == generation_ || !nfa_.live[n]) continue;
      mark_[n] = generation_;
      const NfaNode& node = nfa_.nodes[n];
      if (node.kind == NfaNode::kSplit) {
        todo.push_back(node.b);
        todo.push_back(node.a);
      } else {
        out.push_back(n);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  int state_of(std::vector<int> set) {
    if (set.empty()) return kDead;
    std::vector<int64_t> key(set.begin(), set.end());
    auto it = index_.find(key);
    if (it != index_.end()) return it->second;
    // The set twice (state and index key) and the containers' own overhead.
    state_bytes_ += set.size() * (sizeof(int) + sizeof(int64_t)) + 160;
    if (state_bytes_ > max_state_bytes_) {
      throw Exhausted("the regex's automaton outgrew its " +
                               std::to_string(max_state_bytes_ >> 20) + " MB budget at " +
                               std::to_string(states_.size()) + " states");
    }
    State st;
    for (int n : set) {
      st.final |= nfa_.nodes[n].kind == NfaNode::kMatch;
      st.shortest = std::min(st.shortest, tokens_left(n));
    }
    st.nfa = std::move(set);
    states_.push_back(std::move(st));
    int id = static_cast<int>(states_.size()) - 1;
    index_.emplace(std::move(key), id);
    return id;
  }

  // A node's shortest path: its byte (the lowest single-byte token its range holds) and the
  // byte step or match it leads to with the fewest bytes left (the lowest on ties). Fixed per
  // node, so the path from any node on another's is the rest of that one's.
  uint8_t path_byte(int n) const {
    const NfaNode& node = nfa_.nodes[n];
    bool range = node.kind == NfaNode::kByte;
    int last = node.lo;
    for (int b = range ? node.lo : 0; b <= (range ? node.hi : 255); ++b) {
      if (!nfa_.takes(node, b)) continue;
      if (vocab_.single_byte[b]) return static_cast<uint8_t>(b);
      last = b;
    }
    return static_cast<uint8_t>(last);
  }
  int next_on_path(int n) {
    auto it = next_on_path_.find(n);
    if (it != next_on_path_.end()) return it->second;
    std::vector<int> reached = closure({nfa_.nodes[n].a});
    int best = -1;
    for (int m : reached) {
      if (best < 0 || bytes_left_[m] < bytes_left_[best]) best = m;
    }
    next_on_path_.emplace(n, best);
    state_bytes_ += kPathEntryBytes;
    return best;
  }

  // An upper bound on the tokens from node n to the match: n's shortest path (in bytes) cut
  // greedily into the longest tokens it starts with. Each token ends on the path, at a node
  // whose own count is one less: a state holding n reaches, by the path's first token, a
  // state holding that node, so a budget that fits a state's bound still fits after it.
  int tokens_left(int n) {
    std::vector<int> todo{n};
    while (!todo.empty()) {
      int m = todo.back();
      if (tokens_left_.count(m)) {
        todo.pop_back();
        continue;
      }
      if (nfa_.nodes[m].kind == NfaNode::kMatch || bytes_left_[m] == Nfa::kNever) {
        tokens_left_[m] = nfa_.nodes[m].kind == NfaNode::kMatch ? 0 : Nfa::kNever;
        todo.pop_back();
        continue;
      }
      int end = token_on_path(m);
      if (end < 0) {
        tokens_left_[m] = Nfa::kNever;
        todo.pop_back();
        continue;
      }
      auto it = tokens_left_.find(end);
      if (it == tokens_left_.end()) {
        todo.push_back(end);
        continue;
      }
      tokens_left_[m] = it->second == Nfa::kNever ? Nfa::kNever : it->second + 1;
      state_bytes_ += kPathEntryBytes;
      todo.pop_back();
    }
    return tokens_left_[n];
  }

  // Where the longest token that n's shortest path starts with ends on it (a single-byte
  // token always starts it: the path's bytes are such tokens).
  int token_on_path(int n) {
    const Trie& trie = vocab_.all;
    int node = 0, cur = n, end = -1;
    while (Nfa::steps(nfa_.nodes[cur])) {
      uint8_t b = path_byte(cur);
      auto first = trie.child_byte.begin() + trie.child_start[node];
      auto last = trie.child_byte.begin() + trie.child_start[node + 1];
      auto at = std::lower_bound(first, last, b);
      if (at == last || *at != b) break;
      node = trie.child_node[at - trie.child_byte.begin()];
      cur = next_on_path(cur);
      if (trie.token_start[node] != trie.token_start[node + 1]) end = cur;
    }
    return end;
  }

  void forget_masks() {
    masks_.clear();
    mask_index_.clear();
    budget_index_.clear();
    ++epoch_;
  }

  void drop_tables() {
    for (State& st : states_) std::vector<int>().swap(st.trans);
    tables_ = 0;
  }

  // Nodes of counted units replaced by (group, offset, need, room), the counts capped at
  // the longest token: states equal under this key allow the same tokens.
  //
  // A lookahead's copies also differ in which nodes can still finish (X may need more
  // characters than a token holds): past the minimum length, copies with room for a token
  // plus X's longest finish cannot be told apart. Before it, `need` stays exact with a
  // maximum (a loop's period could make a window of lengths reachable from one copy and not
  // another); without one, need past a token plus the copy's size (which bounds X's
  // loop-free finishes) cannot be told apart.
  std::vector<int64_t> canonical(int s) {
    std::vector<int64_t> key;
    for (int n : states_[s].nfa) {
      int g = nfa_.counted[n];
      if (g < 0) {
        key.push_back(n);
        continue;
      }
      const Counted& c = nfa_.groups[g];
      int unit = (n - c.base) / c.size, offset = (n - c.base) % c.size;
      int64_t window = vocab_.max_len + 1;
      bool bounded = c.room[unit] != INT32_MAX;
      int64_t need = c.need[unit];
      if (!c.span) need = std::min<int64_t>(need, window);
      else if (!bounded) need = std::min<int64_t>(need, window + c.size);
      int64_t room = std::min<int64_t>(c.room[unit], window + (c.span ? c.finish : 0));
      need = std::min<int64_t>(need, kMaxSpanChars);  // 13 bits each; spans stay below
      room = std::min<int64_t>(room, kMaxSpanChars);
      key.push_back(-1 - ((((static_cast<int64_t>(g) << 20 | offset) << 13 | need) << 13) | room));
    }
    std::sort(key.begin(), key.end());
    return key;
  }

  // When every plain byte leads from s to one state, and from that state to one state, and
  // so on (a free string; a length lookahead over `.*`), plain tokens are allowed by their
  // length alone: the longest allowed, or -1 when s is not such a chain.
  int plain_chain(int s) {
    int cur = s;
    for (int k = 0; k < vocab_.max_len; ++k) {
      int next = step(cur, 'a');
      for (int b = 0x20; b < 0x7F; ++b) {
        if (plain_byte(b) && step(cur, static_cast<uint8_t>(b)) != next) return -1;
      }
      if (next < 0) return k;
      if (next == cur) break;  // a loop: every length
      cur = next;
    }
    return vocab_.max_len;
  }

  // s's tokens whose next state completes within `after` tokens, and in *reach the most any
  // of s's next states needs. On a plain chain (walk) the plain tokens of each length lead
  // to one state: they are kept by length, and only the others walk the trie.
  std::vector<uint32_t> budget_walk(int s, int64_t after, int* reach) {
    std::vector<uint32_t> bits(vocab_.words, 0);
    const Trie* trie_ptr = &vocab_.all;
    int plain = plain_chain(s);
    if (plain >= 0) {
      trie_ptr = &vocab_.special;
      int cur = s;
      for (int k = 1; k <= plain; ++k) {
        cur = step(cur, 'a');
        int need = shortest(cur);
        *reach = std::max(*reach, need);
        if (need > after) continue;
        const auto& upto = vocab_.plain_upto[k];
        const auto& shorter = vocab_.plain_upto[k - 1];
        for (int w = 0; w < vocab_.words; ++w) bits[w] |= upto[w] & ~shorter[w];
      }
    }
    const Trie& trie = *trie_ptr;
    std::vector<std::pair<int, int>> todo{{0, s}};
    while (!todo.empty()) {
      auto [node, state] = todo.back();
      todo.pop_back();
      for (int c = trie.child_start[node]; c < trie.child_start[node + 1]; ++c) {
        int t = step(state, trie.child_byte[c]);
        if (t < 0) continue;
        int child = trie.child_node[c];
        if (trie.token_start[child] != trie.token_start[child + 1]) {
          int need = shortest(t);
          *reach = std::max(*reach, need);
          if (need <= after) {
            for (int k = trie.token_start[child]; k < trie.token_start[child + 1]; ++k) {
              int id = trie.tokens[k];
              bits[id / 32] |= 1u << (id % 32);
            }
          }
        }
        if (trie.child_start[child] != trie.child_start[child + 1]) todo.push_back({child, t});
      }
    }
    return bits;
  }

  std::vector<uint32_t> walk(int s) {
    std::vector<uint32_t> bits(vocab_.words, 0);
    const Trie* trie = &vocab_.all;
    int plain = plain_chain(s);
    if (plain >= 0) {
      bits = vocab_.plain_upto[plain];
      trie = &vocab_.special;
    }
    std::vector<std::pair<int, int>> todo{{0, s}};  // (trie node, DFA state)
    while (!todo.empty()) {
      auto [node, state] = todo.back();
      todo.pop_back();
      for (int c = trie->child_start[node]; c < trie->child_start[node + 1]; ++c) {
        int t = step(state, trie->child_byte[c]);
        if (t < 0) continue;
        int child = trie->child_node[c];
        for (int k = trie->token_start[child]; k < trie->token_start[child + 1]; ++k) {
          int id = trie->tokens[k];
          bits[id / 32] |= 1u << (id % 32);
        }
        if (trie->child_start[child] != trie->child_start[child + 1]) todo.push_back({child, t});
      }
    }
    return bits;
  }
};

thread_local std::string last_error;

}  // namespace

extern "C" {

const char* lazy_last_error() { return last_error.c_str(); }

void* lazy_vocab_new(int n, const char* data, const int64_t* offsets) {
  try {
    return new Vocab(n, data, offsets);
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

void lazy_vocab_free(void* v) { delete static_cast<Vocab*>(v); }

void* lazy_grammar_new(const void* vocab, const char* pattern, int64_t length,
                       int64_t max_state_bytes) {
  try {
    return new Grammar(*static_cast<const Vocab*>(vocab), std::string(pattern, length),
                       static_cast<size_t>(max_state_bytes));
  } catch (const std::bad_alloc&) {
    last_error = "out of memory building the regex's automaton";
  } catch (const std::exception& e) {
    last_error = e.what();
  }
  return nullptr;
}

void lazy_grammar_free(void* g) { delete static_cast<Grammar*>(g); }

int lazy_start(void* g) { return static_cast<Grammar*>(g)->start(); }

// Entry points return -3 on an error and -4 when the states' budget is spent.

// The state after a token's bytes, or -1 when the regex refuses them.
int lazy_advance(void* gp, int state, const char* data, int64_t length) {
  auto* g = static_cast<Grammar*>(gp);
  std::lock_guard<std::mutex> lock(g->mutex);
  try {
    return g->advance(state, std::string(data, length));
  } catch (const Exhausted& e) {
    last_error = e.what();
    return -4;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -3;
  }
}

// Writes the state's mask (no EOS) into out; returns 1 | 2: final | no token allowed.
int lazy_fill(void* gp, int state, uint32_t* out) {
  auto* g = static_cast<Grammar*>(gp);
  std::lock_guard<std::mutex> lock(g->mutex);
  try {
    const std::vector<uint32_t>& m = g->mask(state);
    std::memcpy(out, m.data(), m.size() * sizeof(uint32_t));
    bool none = std::all_of(m.begin(), m.end(), [](uint32_t w) { return w == 0; });
    return (g->is_final(state) ? 1 : 0) | (none ? 2 : 0);
  } catch (const Exhausted& e) {
    last_error = e.what();
    return -4;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -3;
  }
}

// The mask of tokens whose next state completes within budget - 1 tokens (no EOS) into out;
// returns 1 | 2 | 4: final | no token allowed | steered (a token of the plain mask went).
int lazy_fill_within(void* gp, int state, int64_t budget, uint32_t* out) {
  auto* g = static_cast<Grammar*>(gp);
  std::lock_guard<std::mutex> lock(g->mutex);
  try {
    bool steered = g->budget_mask(state, budget, out);
    const int words = g->vocab_words();
    bool none = std::all_of(out, out + words, [](uint32_t w) { return w == 0; });
    return (g->is_final(state) ? 1 : 0) | (none ? 2 : 0) | (steered ? 4 : 0);
  } catch (const Exhausted& e) {
    last_error = e.what();
    return -4;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -3;
  }
}

// The fewest tokens completing the text from state (single-byte tokens), -1: none can.
int64_t lazy_shortest(void* gp, int state) {
  auto* g = static_cast<Grammar*>(gp);
  std::lock_guard<std::mutex> lock(g->mutex);
  int n = g->shortest(state);
  return n == Nfa::kNever ? -1 : n;
}

int lazy_is_final(void* gp, int state) {
  auto* g = static_cast<Grammar*>(gp);
  std::lock_guard<std::mutex> lock(g->mutex);
  return g->is_final(state);
}

// Forced bytes from `state` (at most `limit`) into out; their count, the end state in *end.
int lazy_forced(void* gp, int state, char* out, int limit, int* end) {
  auto* g = static_cast<Grammar*>(gp);
  std::lock_guard<std::mutex> lock(g->mutex);
  try {
    std::string s = g->forced(state, limit, end);
    std::memcpy(out, s.data(), s.size());
    return static_cast<int>(s.size());
  } catch (const Exhausted& e) {
    last_error = e.what();
    return -4;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -3;
  }
}

// Sizes, for tests and memory accounting: NFA nodes, DFA states, cached masks, states' bytes.
void lazy_stats(void* gp, int64_t* out) {
  auto* g = static_cast<Grammar*>(gp);
  std::lock_guard<std::mutex> lock(g->mutex);
  out[0] = g->num_nfa_nodes();
  out[1] = g->num_states();
  out[2] = g->num_masks();
  out[3] = static_cast<int64_t>(g->state_bytes());
}

}  // extern "C"
