#include "pickle_object.hpp"

#include <fmt/format.h>

#include <cstdint>

#include "../pickle/unpickler.hpp"
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

// Plain objects in the Document's arena. Each op adds at most one object, so the arena is
// bounded by the input's size; the memo is bounded separately so a tiny stream cannot ask for
// a huge table. Objects are mutable only while parsing (SETITEMS, APPENDS, BUILD on one
// already pushed).
class ObjectBuilder {
 public:
  using Value = Object*;
  static constexpr size_t kMaxStack = SIZE_MAX;  // the arena's bound covers the stack
  static constexpr uint64_t kMaxMemo = 1u << 22;

  ObjectBuilder(Cursor& in, Document& doc) : in_(in), doc_(doc) {}

  // DCP metadata is written by Python's pickle, not torch.save: no persistent ids, and none of
  // protocol 2's string forms or DUP, which that writer never emits.
  bool supports(uint8_t code) const {
    return code != op::kDup && code != op::kBinString && code != op::kShortBinString &&
           code != op::kLong4 && code != op::kBinPersId;
  }
  UsageError unsupported(uint8_t code) const {
    return in_.fail_at(in_.pos() - 1, fmt::format("unsupported opcode 0x{:02x}", code));
  }

  Value none() { return make(Object::kNone); }
  Value boolean(bool b) {
    Object* o = make(Object::kBool);
    o->b = b;
    return o;
  }
  Value integer(int64_t i) {
    Object* o = make(Object::kInt);
    o->i = i;
    return o;
  }
  Value real(double f) {
    Object* o = make(Object::kFloat);
    o->f = f;
    return o;
  }
  Value text(std::string s) { return with_string(Object::kStr, std::move(s)); }
  Value bytes(std::string s) { return with_string(Object::kBytes, std::move(s)); }
  Value global(std::string dotted) { return with_string(Object::kGlobal, std::move(dotted)); }
  Value tuple(std::vector<Value> items) { return with_items(Object::kTuple, std::move(items)); }
  Value list(std::vector<Value> items) { return with_items(Object::kList, std::move(items)); }
  Value dict() { return make(Object::kDict); }

  Value stack_global(Value module, Value name) {
    if (name->kind != Object::kStr || module->kind != Object::kStr) {
      throw in_.fail("STACK_GLOBAL needs two strings");
    }
    return global(module->s + "." + name->s);
  }
  void set_items(Value dict, const std::vector<Value>& kv, const char* op) {
    expect(dict, Object::kDict, op);
    if (kv.size() % 2) throw in_.fail("odd number of items for a dict");
    for (size_t j = 0; j < kv.size(); j += 2) dict->pairs.emplace_back(kv[j], kv[j + 1]);
  }
  void append(Value list, const std::vector<Value>& items, const char* op) {
    expect(list, Object::kList, op);
    list->items.insert(list->items.end(), items.begin(), items.end());
  }
  // NEWOBJ and REDUCE both make an instance of the named class; nothing is called.
  Value reduce(Value callable, Value args) { return instance(callable, args); }
  Value newobj(Value cls, Value args) { return instance(cls, args); }
  void build(Value object, Value state) {
    expect(object, Object::kInstance, "BUILD");
    object->state = state;
  }
  Value persistent_load(Value) { throw unsupported(op::kBinPersId); }  // refused by supports()
  void pushed(const Value&) {}

 private:
  Object* make(Object::Kind kind) {
    doc_.arena.push_back(std::make_unique<Object>());
    doc_.arena.back()->kind = kind;
    return doc_.arena.back().get();
  }
  Object* with_string(Object::Kind kind, std::string s) {
    Object* o = make(kind);
    o->s = std::move(s);
    return o;
  }
  Object* with_items(Object::Kind kind, std::vector<Value> items) {
    Object* o = make(kind);
    o->items.assign(items.begin(), items.end());
    return o;
  }
  void expect(const Object* o, Object::Kind want, const char* op) const {
    if (o->kind != want) throw in_.fail(fmt::format("{} on a {}", op, kind_name(o->kind)));
  }
  Value instance(Value callable, Value args) {
    if (callable->kind != Object::kGlobal) {
      throw in_.fail(fmt::format("NEWOBJ/REDUCE on a {}, not a global", kind_name(callable->kind)));
    }
    if (args->kind != Object::kTuple) throw in_.fail("NEWOBJ/REDUCE arguments are not a tuple");
    Object* o = make(Object::kInstance);
    o->cls = callable->s;
    o->items = args->items;
    return o;
  }

  Cursor& in_;
  Document& doc_;
};

}  // namespace

Document parse(const uint8_t* bytes, size_t size, const std::string& source) {
  Cursor in(bytes, size, source, "pickle");
  Document doc;
  ObjectBuilder builder(in, doc);
  doc.root = Unpickler<ObjectBuilder>(in, builder).run();
  return doc;
}

}  // namespace ddp::pickle
