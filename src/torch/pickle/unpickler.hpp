#pragma once
// The one pickle parser of ddp: the opcodes, their operands and the pickle machine's stack and
// memo. What a value *is* belongs to a Builder, so the two readers built on it share every byte
// of decoding: the torch.save reader of snapshots (snapshot/torch_builder.hpp: tensors, storages,
// torch's rebuild functions) and the plain-object reader of DCP metadata
// (checkpoint/pickle_object.hpp: classes kept as names, never called).
//
// Every read is bounds-checked and every error is a UsageError naming the source and the byte
// offset ("<source>: cannot read the <what> at byte <n>: <why>"), never a crash or an
// over-read, so both readers are safe to fuzz. No LibTorch here.
//
// A Builder provides:
//   using Value = ...;                  a nullable handle (a pointer); null is the parser's MARK
//   static constexpr size_t kMaxStack;  deepest stack accepted
//   static constexpr uint64_t kMaxMemo; largest memo index accepted
//   bool supports(uint8_t op) const;    false: the opcode is refused with unsupported(op)
//   UsageError unsupported(uint8_t op) const;
//   Value none(), boolean(bool), integer(int64_t), real(double), text(std::string),
//         bytes(std::string), tuple(std::vector<Value>), list(std::vector<Value>), dict();
//   Value global(std::string dotted), stack_global(Value module, Value name);
//   void set_items(Value dict, const std::vector<Value>& key_value_pairs, const char* op);
//   void append(Value list, const std::vector<Value>& items, const char* op);
//   Value reduce(Value callable, Value args), newobj(Value cls, Value args),
//         persistent_load(Value pid);
//   void build(Value object, Value state);
//   void pushed(const Value& v);        every value as it goes onto the stack
// and reports its own errors through the Cursor it was given.

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/util/error.hpp"

namespace ddp::pickle {

// The opcodes either reader knows (Python's Lib/pickle.py names).
namespace op {
constexpr uint8_t kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2';
constexpr uint8_t kEmptyDict = '}', kEmptyList = ']', kEmptyTuple = ')', kDict = 'd', kList = 'l',
                  kTuple = 't', kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87;
constexpr uint8_t kSetItem = 's', kSetItems = 'u', kAppend = 'a', kAppends = 'e';
constexpr uint8_t kNone = 'N', kNewTrue = 0x88, kNewFalse = 0x89, kBinInt = 'J', kBinInt1 = 'K',
                  kBinInt2 = 'M', kLong1 = 0x8a, kLong4 = 0x8b, kBinFloat = 'G';
constexpr uint8_t kBinUnicode = 'X', kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d, kBinString = 'T',
                  kShortBinString = 'U', kBinBytes = 'B', kShortBinBytes = 'C', kBinBytes8 = 0x8e;
constexpr uint8_t kGlobal = 'c', kStackGlobal = 0x93, kReduce = 'R', kNewObj = 0x81, kBuild = 'b',
                  kBinPersId = 'Q';
constexpr uint8_t kBinPut = 'q', kLongBinPut = 'r', kMemoize = 0x94, kBinGet = 'h',
                  kLongBinGet = 'j';
constexpr uint8_t kProto = 0x80, kFrame = 0x95;
}  // namespace op

// The bytes of one pickle and the read position.
class Cursor {
 public:
  // `what` names the format in errors ("pickle", "torch.save pickle"); `source` the file.
  Cursor(const uint8_t* p, size_t n, const std::string& source, std::string what)
      : p_(p), n_(n), source_(source), what_(std::move(what)) {}

  size_t pos() const { return pos_; }
  size_t left() const { return n_ - pos_; }
  const std::string& source() const { return source_; }

  UsageError fail(const std::string& why) const { return fail_at(pos_, why); }
  UsageError fail_at(size_t pos, const std::string& why) const {
    return UsageError(
        fmt::format("{}: cannot read the {} at byte {}: {}", source_, what_, pos, why));
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
  std::string str(size_t k) {
    const uint8_t* b = take(k);
    return std::string(reinterpret_cast<const char*>(b), k);
  }
  // Up to the next '\n', which is consumed (GLOBAL's module and name).
  std::string line() {
    const void* nl = std::memchr(p_ + pos_, '\n', n_ - pos_);
    if (!nl) throw fail("unterminated GLOBAL name");
    std::string r = str(static_cast<const uint8_t*>(nl) - (p_ + pos_));
    pos_ += 1;
    return r;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& source_;
  std::string what_;
};

// Runs the pickle machine over `cursor` until STOP and returns the one value left.
template <class Builder>
class Unpickler {
 public:
  using Value = typename Builder::Value;

  Unpickler(Cursor& cursor, Builder& builder) : in_(cursor), b_(builder) {}

  Value run() {
    for (;;) {
      const uint8_t code = *in_.take(1);
      if (!b_.supports(code)) throw b_.unsupported(code);
      if (code == op::kStop) {
        Value r = pop();
        if (!stack_.empty()) throw in_.fail("values left on the stack at STOP");
        return r;
      }
      step(code);
    }
  }

 private:
  void step(uint8_t code) {
    switch (code) {
      case op::kProto:
        in_.take(1);
        return;
      case op::kFrame:  // protocol 4: frames are only a read-ahead hint
        in_.take(8);
        return;
      case op::kMark:
        push(Value{});
        return;
      case op::kPop:
        pop();
        return;
      case op::kPopMark:
        pop_mark();
        return;
      case op::kDup:
        push(top());
        return;
      case op::kEmptyDict:
        push(b_.dict());
        return;
      case op::kEmptyList:
        push(b_.list({}));
        return;
      case op::kEmptyTuple:
        push(b_.tuple({}));
        return;
      case op::kDict: {
        Value d = b_.dict();
        b_.set_items(d, pop_mark(), "SETITEMS");
        push(d);
        return;
      }
      case op::kList:
        push(b_.list(pop_mark()));
        return;
      case op::kTuple:
        push(b_.tuple(pop_mark()));
        return;
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        std::vector<Value> items(code - op::kTuple1 + 1);
        for (size_t j = items.size(); j-- > 0;) items[j] = pop();
        push(b_.tuple(std::move(items)));
        return;
      }
      case op::kSetItem: {
        Value v = pop();
        Value k = pop();
        b_.set_items(top(), {k, v}, "SETITEM");
        return;
      }
      case op::kSetItems: {
        auto kv = pop_mark();
        b_.set_items(top(), kv, "SETITEMS");
        return;
      }
      case op::kAppend: {
        Value v = pop();
        b_.append(top(), {v}, "APPEND");
        return;
      }
      case op::kAppends: {
        auto items = pop_mark();
        b_.append(top(), items, "APPENDS");
        return;
      }
      case op::kNone:
        push(b_.none());
        return;
      case op::kNewTrue:
      case op::kNewFalse:
        push(b_.boolean(code == op::kNewTrue));
        return;
      case op::kBinInt:
        push(b_.integer(static_cast<int32_t>(in_.le(4))));
        return;
      case op::kBinInt1:
        push(b_.integer(static_cast<int64_t>(in_.le(1))));
        return;
      case op::kBinInt2:
        push(b_.integer(static_cast<int64_t>(in_.le(2))));
        return;
      case op::kLong1:
      case op::kLong4: {  // little-endian two's complement of `len` bytes
        const uint64_t len = code == op::kLong1 ? in_.le(1) : in_.le(4);
        if (len > 8) throw in_.fail(fmt::format("integer of {} bytes does not fit 64 bits", len));
        uint64_t v = len ? in_.le(len) : 0;
        if (len > 0 && len < 8 && (v >> (8 * len - 1)) & 1) v |= ~uint64_t{0} << (8 * len);
        push(b_.integer(static_cast<int64_t>(v)));
        return;
      }
      case op::kBinFloat: {  // big-endian
        const uint8_t* bytes = in_.take(8);
        uint64_t bits = 0;
        for (int j = 0; j < 8; ++j) bits = (bits << 8) | bytes[j];
        double f;
        std::memcpy(&f, &bits, sizeof f);
        push(b_.real(f));
        return;
      }
      case op::kBinUnicode:
      case op::kShortBinUnicode:
      case op::kBinUnicode8:
      case op::kBinString:
      case op::kShortBinString:
      case op::kBinBytes:
      case op::kShortBinBytes:
      case op::kBinBytes8: {
        const size_t width = (code == op::kShortBinUnicode || code == op::kShortBinString ||
                              code == op::kShortBinBytes)
                                 ? 1
                             : (code == op::kBinUnicode8 || code == op::kBinBytes8) ? 8
                                                                                    : 4;
        const uint64_t len = in_.le(width);
        if (len > in_.left()) {
          throw in_.fail(fmt::format("string of {} bytes runs past the end", len));
        }
        std::string s = in_.str(len);
        const bool is_bytes =
            code == op::kBinBytes || code == op::kShortBinBytes || code == op::kBinBytes8;
        push(is_bytes ? b_.bytes(std::move(s)) : b_.text(std::move(s)));
        return;
      }
      case op::kGlobal: {  // "module\nname\n"
        std::string dotted = in_.line();
        dotted += "." + in_.line();
        push(b_.global(std::move(dotted)));
        return;
      }
      case op::kStackGlobal: {
        Value name = pop();
        Value module = pop();
        push(b_.stack_global(module, name));
        return;
      }
      case op::kReduce:
      case op::kNewObj: {
        Value args = pop();
        Value callable = pop();
        push(code == op::kReduce ? b_.reduce(callable, args) : b_.newobj(callable, args));
        return;
      }
      case op::kBuild: {
        Value state = pop();
        b_.build(top(), state);
        return;
      }
      case op::kBinPersId: {
        Value pid = pop();
        push(b_.persistent_load(pid));
        return;
      }
      case op::kBinPut:
        memo_put(in_.le(1));
        return;
      case op::kLongBinPut:
        memo_put(in_.le(4));
        return;
      case op::kMemoize:
        memo_put(memo_.size());
        return;
      case op::kBinGet:
        push(memo_get(in_.le(1)));
        return;
      case op::kLongBinGet:
        push(memo_get(in_.le(4)));
        return;
      default:
        throw b_.unsupported(code);
    }
  }

  // Values and MARKs (null) alike count against the stack's bound.
  void push(Value v) {
    if (stack_.size() > Builder::kMaxStack) {
      throw in_.fail(fmt::format("stack deeper than {} entries", Builder::kMaxStack));
    }
    if (v) b_.pushed(v);
    stack_.push_back(std::move(v));
  }
  Value pop() {
    if (stack_.empty()) throw in_.fail("stack underflow");
    Value r = std::move(stack_.back());
    stack_.pop_back();
    if (!r) throw in_.fail("unexpected MARK");
    return r;
  }
  Value& top() {
    if (stack_.empty() || !stack_.back()) throw in_.fail("stack underflow");
    return stack_.back();
  }
  // The values pushed since the last MARK, which is removed.
  std::vector<Value> pop_mark() {
    size_t m = stack_.size();
    while (m > 0 && stack_[m - 1]) --m;
    if (m == 0) throw in_.fail("no MARK on the stack");
    std::vector<Value> r(stack_.begin() + m, stack_.end());
    stack_.resize(m - 1);
    return r;
  }
  void memo_put(uint64_t id) {
    if (id > Builder::kMaxMemo) throw in_.fail(fmt::format("memo index {} too large", id));
    memo_[id] = top();
  }
  Value memo_get(uint64_t id) {
    auto it = memo_.find(id);
    if (it == memo_.end()) throw in_.fail(fmt::format("memo index {} was never stored", id));
    return it->second;
  }

  Cursor& in_;
  Builder& b_;
  std::vector<Value> stack_;
  std::unordered_map<uint64_t, Value> memo_;
};

}  // namespace ddp::pickle
