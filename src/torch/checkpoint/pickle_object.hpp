#pragma once
// A Python pickle read as a tree of plain objects, for files whose structure ddp knows (DCP's
// `.metadata`): dicts, lists, tuples, strings, numbers, and objects made by NEWOBJ or REDUCE
// from a named global plus the state BUILD gave them. No global is ever looked up or called:
// a class is kept as its "module.name". Malformed or hostile input is a UsageError naming
// `source` and the byte offset, never a crash, an over-read or unbounded memory.
//
// Parsed by the one pickle parser (../pickle/unpickler.hpp), which the torch.save reader of
// snapshots shares. No LibTorch here: the DCP metadata layer sits below the tensors.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::pickle {

struct Object {
  enum Kind { kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kGlobal, kInstance };
  Kind kind = kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                               // str, bytes, global "module.name"
  std::vector<const Object*> items;                            // tuple, list; instance: its args
  std::vector<std::pair<const Object*, const Object*>> pairs;  // dict, in insertion order
  std::string cls;                                             // instance: "module.name"
  const Object* state = nullptr;                               // instance: BUILD's state, or null

  // The value for a str key of a dict, or null.
  const Object* find(const std::string& key) const;
};

const char* kind_name(Object::Kind kind);

// Owns every Object of one parsed pickle; `root` points into it.
struct Document {
  std::vector<std::unique_ptr<Object>> arena;
  const Object* root = nullptr;
};

Document parse(const uint8_t* bytes, size_t size, const std::string& source);

}  // namespace ddp::pickle
