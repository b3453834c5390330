#include "pickle_object.hpp"

#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

#include "ddp/util/error.hpp"

namespace ddp::pickle {

const Object* Object::find(const std::string& key) const {
  for (const auto& [k, v] : pairs) {
    if (k->kind == kStr && k->s == key) return v;
  }
  return nullptr;
}

const char* kind_name(Object::Kind kind) {
  static const char* names[] = {"None",  "bool", "int",  "float",  "str",     "bytes",
                                "tuple", "list", "dict", "global", "instance"};
  return names[kind];
}

namespace {

// Each op adds at most one object, so the arena is bounded by the input's size; the memo and
// stack are bounded separately so a tiny stream cannot ask for a huge table.
constexpr size_t kMaxMemo = 1u << 22;

class Parser {
 public:
  Parser(const uint8_t* p, size_t n, const std::string& source) : p_(p), n_(n), source_(source) {}

  Document run() {
    while (true) {
      if (pos_ >= n_) throw fail("ends without STOP");
      const uint8_t op = p_[pos_++];
      if (op == '.') break;
      step(op);
    }
    if (stack_.size() != 1 || stack_[0] == &mark_) throw fail("STOP with an unbalanced stack");
    doc_.root = stack_[0];
    return std::move(doc_);
  }

 private:
  UsageError fail(const std::string& what) const {
    return UsageError(
        fmt::format("{}: cannot read the pickle at byte {}: {}", source_, pos_, what));
  }
  const uint8_t* take(size_t k) {
    if (n_ - pos_ < k) throw fail(fmt::format("truncated ({} more bytes needed)", k));
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  uint64_t le(size_t k) {
    const uint8_t* b = take(k);
    uint64_t v = 0;
    for (size_t j = 0; j < k; ++j) v |= uint64_t{b[j]} << (8 * j);
    return v;
  }
  std::string bytes(size_t k) {
    const uint8_t* b = take(k);
    return std::string(reinterpret_cast<const char*>(b), k);
  }
  std::string line() {
    const void* nl = std::memchr(p_ + pos_, '\n', n_ - pos_);
    if (!nl) throw fail("unterminated GLOBAL name");
    std::string r = bytes(static_cast<const uint8_t*>(nl) - (p_ + pos_));
    pos_ += 1;
    return r;
  }
  Object* make(Object::Kind kind) {
    doc_.arena.push_back(std::make_unique<Object>());
    doc_.arena.back()->kind = kind;
    return doc_.arena.back().get();
  }
  void push(const Object* o) { stack_.push_back(o); }
  const Object* pop() {
    if (stack_.empty() || stack_.back() == &mark_) throw fail("stack underflow");
    const Object* r = stack_.back();
    stack_.pop_back();
    return r;
  }
  // Objects are mutable only while parsing (SETITEMS, APPENDS, BUILD on one already pushed).
  Object* pop_mutable(Object::Kind want, const char* op) {
    auto* o = const_cast<Object*>(pop());
    if (o->kind != want) throw fail(fmt::format("{} on a {}", op, kind_name(o->kind)));
    return o;
  }
  std::vector<const Object*> pop_mark() {
    size_t m = stack_.size();
    while (m > 0 && stack_[m - 1] != &mark_) --m;
    if (m == 0) throw fail("no MARK on the stack");
    std::vector<const Object*> r(stack_.begin() + m, stack_.end());
    stack_.resize(m - 1);
    return r;
  }
  const Object* tuple(std::vector<const Object*> items) {
    Object* t = make(Object::kTuple);
    t->items = std::move(items);
    return t;
  }
  void set_items(Object* dict, const std::vector<const Object*>& kv) {
    if (kv.size() % 2) throw fail("odd number of items for a dict");
    for (size_t j = 0; j < kv.size(); j += 2) dict->pairs.emplace_back(kv[j], kv[j + 1]);
  }
  void instance(const Object* callable, const Object* args) {
    if (callable->kind != Object::kGlobal) {
      throw fail(fmt::format("NEWOBJ/REDUCE on a {}, not a global", kind_name(callable->kind)));
    }
    if (args->kind != Object::kTuple) throw fail("NEWOBJ/REDUCE arguments are not a tuple");
    Object* o = make(Object::kInstance);
    o->cls = callable->s;
    o->items = args->items;
    push(o);
  }

  void step(uint8_t op) {
    switch (op) {
      case 0x80:
        take(1);
        return;  // PROTO
      case 0x95:
        take(8);
        return;  // FRAME: a hint only
      case '(':
        push(&mark_);
        return;  // MARK
      case '0':
        pop();
        return;  // POP
      case '1':
        pop_mark();
        return;  // POP_MARK
      case 'N':
        push(make(Object::kNone));
        return;
      case 0x88:
      case 0x89: {
        Object* o = make(Object::kBool);
        o->b = op == 0x88;
        push(o);
        return;
      }
      case 'K':
      case 'M':
      case 'J': {
        Object* o = make(Object::kInt);
        const uint64_t v = le(op == 'K' ? 1 : op == 'M' ? 2 : 4);
        o->i = op == 'J' ? static_cast<int32_t>(static_cast<uint32_t>(v)) : static_cast<int64_t>(v);
        push(o);
        return;
      }
      case 0x8a: {  // LONG1
        const size_t k = le(1);
        if (k > 8) throw fail("integer wider than 64 bits");
        uint64_t v = le(k);
        if (k > 0 && k < 8 && (v >> (8 * k - 1)) & 1) v |= ~uint64_t{0} << (8 * k);  // sign
        Object* o = make(Object::kInt);
        o->i = static_cast<int64_t>(v);
        push(o);
        return;
      }
      case 'G': {
        const uint8_t* b = take(8);
        uint64_t bits = 0;
        for (int j = 0; j < 8; ++j) bits = (bits << 8) | b[j];
        Object* o = make(Object::kFloat);
        std::memcpy(&o->f, &bits, sizeof bits);
        push(o);
        return;
      }
      case 0x8c:    // SHORT_BINUNICODE
      case 'X':     // BINUNICODE
      case 0x8d:    // BINUNICODE8
      case 'C':     // SHORT_BINBYTES
      case 'B':     // BINBYTES
      case 0x8e: {  // BINBYTES8
        const size_t width = (op == 0x8c || op == 'C') ? 1 : (op == 'X' || op == 'B') ? 4 : 8;
        const uint64_t k = le(width);
        if (k > n_ - pos_) throw fail(fmt::format("string of {} bytes runs past the end", k));
        Object* o = make((op == 'C' || op == 'B' || op == 0x8e) ? Object::kBytes : Object::kStr);
        o->s = bytes(k);
        push(o);
        return;
      }
      case ')':
        push(tuple({}));
        return;
      case 't':
        push(tuple(pop_mark()));
        return;
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<const Object*> items(op - 0x84);
        for (size_t j = items.size(); j-- > 0;) items[j] = pop();
        push(tuple(std::move(items)));
        return;
      }
      case ']':
        push(make(Object::kList));
        return;
      case 'l': {
        Object* l = make(Object::kList);
        l->items = pop_mark();
        push(l);
        return;
      }
      case 'a': {
        const Object* v = pop();
        Object* l = pop_mutable(Object::kList, "APPEND");
        l->items.push_back(v);
        push(l);
        return;
      }
      case 'e': {
        auto items = pop_mark();
        Object* l = pop_mutable(Object::kList, "APPENDS");
        l->items.insert(l->items.end(), items.begin(), items.end());
        push(l);
        return;
      }
      case '}':
        push(make(Object::kDict));
        return;
      case 'd': {
        Object* d = make(Object::kDict);
        set_items(d, pop_mark());
        push(d);
        return;
      }
      case 's': {
        const Object* v = pop();
        const Object* k = pop();
        Object* d = pop_mutable(Object::kDict, "SETITEM");
        d->pairs.emplace_back(k, v);
        push(d);
        return;
      }
      case 'u': {
        auto kv = pop_mark();
        Object* d = pop_mutable(Object::kDict, "SETITEMS");
        set_items(d, kv);
        push(d);
        return;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        Object* g = make(Object::kGlobal);
        g->s = line();
        g->s += "." + line();
        push(g);
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const Object* name = pop();
        const Object* module = pop();
        if (name->kind != Object::kStr || module->kind != Object::kStr) {
          throw fail("STACK_GLOBAL needs two strings");
        }
        Object* g = make(Object::kGlobal);
        g->s = module->s + "." + name->s;
        push(g);
        return;
      }
      case 0x81:   // NEWOBJ
      case 'R': {  // REDUCE
        const Object* args = pop();
        const Object* callable = pop();
        instance(callable, args);
        return;
      }
      case 'b': {  // BUILD
        const Object* state = pop();
        Object* o = pop_mutable(Object::kInstance, "BUILD");
        o->state = state;
        push(o);
        return;
      }
      case 0x94:
        memo_put(memo_.size());
        return;  // MEMOIZE
      case 'q':
        memo_put(le(1));
        return;  // BINPUT
      case 'r':
        memo_put(le(4));
        return;  // LONG_BINPUT
      case 'h':
        push(memo_get(le(1)));
        return;  // BINGET
      case 'j':
        push(memo_get(le(4)));
        return;  // LONG_BINGET
      default:
        --pos_;
        throw fail(fmt::format("unsupported opcode 0x{:02x}", op));
    }
  }
  void memo_put(uint64_t id) {
    if (id > kMaxMemo) throw fail(fmt::format("memo index {} too large", id));
    if (stack_.empty() || stack_.back() == &mark_) throw fail("memo of an empty stack");
    memo_[id] = stack_.back();
  }
  const Object* memo_get(uint64_t id) {
    auto it = memo_.find(id);
    if (it == memo_.end()) throw fail(fmt::format("memo index {} was never stored", id));
    return it->second;
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& source_;
  Document doc_;
  Object mark_;  // the MARK sentinel: compared by address
  std::vector<const Object*> stack_;
  std::unordered_map<uint64_t, const Object*> memo_;
};

}  // namespace

Document parse(const uint8_t* bytes, size_t size, const std::string& source) {
  return Parser(bytes, size, source).run();
}

}  // namespace ddp::pickle
