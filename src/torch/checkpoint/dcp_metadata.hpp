#pragma once
// PyTorch Distributed Checkpoint's `.metadata` file (torch.distributed.checkpoint, 2.x, version
// "1.0.0"): the pickled `Metadata` dataclass that FileSystemReader loads. It lists every entry
// of the flattened state dict: a tensor (dtype, global size, chunks) or a pickled value
// ("bytes"), where each chunk or value lies (file, offset, length), and how a flattened key
// unflattens (planner_data).
//
// encode() writes what Python's pickle.load turns into the same Metadata objects PyTorch 2.13
// writes; decode() reads a file PyTorch wrote (or encode() wrote) and refuses, naming the
// entry, what ddp cannot read: storage transforms (compression extensions), non-strided
// layouts, missing storage records.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace ddp::dcp {

// Where one stored item lies: bytes [offset, offset + length) of a file in the checkpoint
// directory, holding a torch.save archive (of a tensor or of a plain value).
struct Storage {
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
};

struct Chunk {
  std::vector<int64_t> offsets;  // where the chunk starts in the global tensor
  std::vector<int64_t> sizes;
  Storage storage;
};

// A flattened key's path in the nested state dict: ("optim", "param_groups", 0, "lr").
using PathPart = std::variant<std::string, int64_t>;

struct Entry {
  std::string fqn;  // the flattened key, "model.fc.weight"
  bool is_tensor = false;
  // Tensors: the dtype's name in torch ("float32", "int64" ...), the global size, its chunks.
  std::string dtype;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
  // Bytes entries: the single record.
  Storage bytes;
  // planner_data's path; empty: the key itself (a top-level entry).
  std::vector<PathPart> path;
};

struct Metadata {
  std::vector<Entry> entries;
  std::string version = "1.0.0";
  std::string save_id;
};

std::string encode(const Metadata& metadata);
// `source` names the file in errors.
Metadata decode(const std::string& bytes, const std::string& source);

}  // namespace ddp::dcp
