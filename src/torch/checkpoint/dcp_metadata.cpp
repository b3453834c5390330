#include "dcp_metadata.hpp"

#include <fmt/format.h>

#include <map>
#include <tuple>

#include "ddp/util/error.hpp"
#include "pickle_object.hpp"
#include "pickle_writer.hpp"

namespace ddp::dcp {

namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

// An instance of a dataclass: cls.__new__(cls), then BUILD with a dict state (written by the
// caller between begin and end).
void begin_instance(pickle::Writer& w, const char* module, const char* cls) {
  w.global(module, cls);
  w.empty_tuple();
  w.newobj();
}

void write_size(pickle::Writer& w, const std::vector<int64_t>& dims) {
  w.global("torch", "Size");
  w.mark();
  w.mark();
  for (int64_t d : dims) w.integer(d);
  w.tuple_from_mark();
  w.tuple_from_mark();
  w.reduce();
}

void write_storage_info(pickle::Writer& w, const Storage& s) {
  begin_instance(w, kFilesystemModule, "_StorageInfo");
  w.empty_dict();
  w.mark();
  w.str("relative_path");
  w.str(s.relative_path);
  w.str("offset");
  w.integer(s.offset);
  w.str("length");
  w.integer(s.length);
  w.setitems_from_mark();
  w.build();
}

// MetadataIndex(fqn, offset): the key of storage_data. A bytes entry has no offset.
void write_index(pickle::Writer& w, const std::string& fqn, const std::vector<int64_t>* offsets) {
  begin_instance(w, kMetadataModule, "MetadataIndex");
  w.empty_dict();
  w.mark();
  w.str("fqn");
  w.str(fqn);
  if (offsets) {
    w.str("offset");
    write_size(w, *offsets);
  }
  w.str("index");
  w.none();
  w.setitems_from_mark();
  w.build();
}

void write_tensor_metadata(pickle::Writer& w, const Entry& e) {
  begin_instance(w, kMetadataModule, "TensorStorageMetadata");
  w.empty_dict();
  w.mark();
  w.str("properties");
  // TensorProperties.__setstate__ takes (dtype, layout, requires_grad, memory format
  // encoding, pin_memory).
  begin_instance(w, kMetadataModule, "TensorProperties");
  w.mark();
  w.global("torch", e.dtype);
  w.global("torch.serialization", "_get_layout");
  w.mark();
  w.str("torch.strided");
  w.tuple_from_mark();
  w.reduce();
  w.boolean(false);
  w.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  w.mark();
  w.integer(0);  // TORCH_CONTIGUOUS_FORMAT
  w.tuple_from_mark();
  w.reduce();
  w.boolean(false);
  w.tuple_from_mark();
  w.build();
  w.str("size");
  write_size(w, e.size);
  w.str("chunks");
  w.empty_list();
  w.mark();
  for (const auto& c : e.chunks) {
    begin_instance(w, kMetadataModule, "ChunkStorageMetadata");
    w.empty_dict();
    w.mark();
    w.str("offsets");
    write_size(w, c.offsets);
    w.str("sizes");
    write_size(w, c.sizes);
    w.setitems_from_mark();
    w.build();
  }
  w.appends_from_mark();
  w.setitems_from_mark();
  w.build();
}

}  // namespace

std::string encode(const Metadata& md) {
  pickle::Writer w;
  begin_instance(w, kMetadataModule, "Metadata");
  w.empty_dict();
  w.mark();

  w.str("state_dict_metadata");
  w.empty_dict();
  w.mark();
  for (const auto& e : md.entries) {
    w.str(e.fqn);
    if (e.is_tensor) {
      write_tensor_metadata(w, e);
    } else {
      begin_instance(w, kMetadataModule, "BytesStorageMetadata");
    }
  }
  w.setitems_from_mark();

  w.str("planner_data");
  w.empty_dict();
  w.mark();
  for (const auto& e : md.entries) {
    w.str(e.fqn);
    w.mark();
    if (e.path.empty()) w.str(e.fqn);
    for (const auto& part : e.path) {
      if (const auto* s = std::get_if<std::string>(&part)) {
        w.str(*s);
      } else {
        w.integer(std::get<int64_t>(part));
      }
    }
    w.tuple_from_mark();
  }
  w.setitems_from_mark();

  w.str("storage_data");
  w.empty_dict();
  w.mark();
  for (const auto& e : md.entries) {
    if (e.is_tensor) {
      for (const auto& c : e.chunks) {
        write_index(w, e.fqn, &c.offsets);
        write_storage_info(w, c.storage);
      }
    } else {
      write_index(w, e.fqn, nullptr);
      write_storage_info(w, e.bytes);
    }
  }
  w.setitems_from_mark();

  w.str("storage_meta");
  begin_instance(w, kMetadataModule, "StorageMeta");
  w.empty_dict();
  w.mark();
  w.str("checkpoint_id");
  w.none();
  w.str("save_id");
  w.str(md.save_id);
  w.str("load_id");
  w.none();
  w.str("modules");
  w.empty_list();
  w.setitems_from_mark();
  w.build();

  w.str("version");
  w.str(md.version);
  w.setitems_from_mark();
  w.build();
  return w.finish();
}

namespace {

using pickle::Object;

class Decoder {
 public:
  explicit Decoder(const std::string& source) : source_(source) {}

  UsageError fail(const std::string& what) const {
    return UsageError(fmt::format(
        "{}: not a Distributed Checkpoint metadata file PyTorch 2.x writes: {}", source_, what));
  }
  const Object& expect(const Object* o, Object::Kind kind, const std::string& what) const {
    if (!o) throw fail(what + " is missing");
    if (o->kind != kind) {
      throw fail(fmt::format("{} is a {}, not a {}", what, pickle::kind_name(o->kind),
                             pickle::kind_name(kind)));
    }
    return *o;
  }
  // A dataclass instance of class `cls` whose state is a dict.
  const Object& instance_state(const Object* o, const std::string& cls,
                               const std::string& what) const {
    const Object& inst = expect(o, Object::kInstance, what);
    if (inst.cls != cls) throw fail(fmt::format("{} is a {}, not a {}", what, inst.cls, cls));
    return expect(inst.state, Object::kDict, what + "'s state");
  }
  int64_t integer(const Object* o, const std::string& what) const {
    return expect(o, Object::kInt, what).i;
  }
  std::string str(const Object* o, const std::string& what) const {
    return expect(o, Object::kStr, what).s;
  }
  // torch.Size((d0, d1, ...)).
  std::vector<int64_t> size(const Object* o, const std::string& what) const {
    const Object& inst = expect(o, Object::kInstance, what);
    if (inst.cls != "torch.Size" || inst.items.size() != 1) {
      throw fail(what + " is not a torch.Size");
    }
    const Object* dims = inst.items[0];
    if (!dims || (dims->kind != Object::kTuple && dims->kind != Object::kList)) {
      throw fail(what + " is not a torch.Size of a tuple");
    }
    std::vector<int64_t> r;
    for (const Object* d : dims->items) r.push_back(integer(d, what + "'s dimension"));
    return r;
  }

  Storage storage(const Object* o, const std::string& what) const {
    const Object& st = instance_state(o, std::string(kFilesystemModule) + "._StorageInfo", what);
    if (const Object* t = st.find("transform_descriptors")) {
      if (t->kind != Object::kNone && !(t->kind == Object::kList && t->items.empty())) {
        throw fail(what +
                   " is stored through a transform (a compression extension of "
                   "torch.distributed.checkpoint); ddp reads untransformed checkpoints: "
                   "save without extensions");
      }
    }
    Storage s;
    s.relative_path = str(st.find("relative_path"), what + ".relative_path");
    s.offset = integer(st.find("offset"), what + ".offset");
    s.length = integer(st.find("length"), what + ".length");
    if (s.offset < 0 || s.length < 0) throw fail(what + " has a negative offset or length");
    if (s.relative_path.empty() || s.relative_path.find('/') != std::string::npos ||
        s.relative_path == "." || s.relative_path == "..") {
      throw fail(fmt::format("{} names file '{}', not a file of the checkpoint directory", what,
                             s.relative_path));
    }
    return s;
  }

  Metadata run(const Object& root) {
    const std::string md_cls = std::string(kMetadataModule) + ".Metadata";
    const Object& state = instance_state(&root, md_cls, "the file's object");
    Metadata md;
    if (const Object* v = state.find("version"); v && v->kind == Object::kStr) md.version = v->s;

    // storage_data: (fqn, chunk offsets or none) -> where it lies.
    std::map<std::pair<std::string, std::vector<int64_t>>, Storage> where;
    std::map<std::string, Storage> where_bytes;
    const Object& sd = expect(state.find("storage_data"), Object::kDict, "storage_data");
    for (const auto& [k, v] : sd.pairs) {
      const Object& idx =
          instance_state(k, std::string(kMetadataModule) + ".MetadataIndex", "a storage key");
      const std::string fqn = str(idx.find("fqn"), "a storage key's fqn");
      const Object* off = idx.find("offset");
      Storage s = storage(v, "the storage of " + fqn);
      if (!off || off->kind == Object::kNone) {
        where_bytes[fqn] = s;
      } else {
        where[{fqn, size(off, "the storage offset of " + fqn)}] = s;
      }
    }

    const Object* planner = state.find("planner_data");
    const Object& sdm =
        expect(state.find("state_dict_metadata"), Object::kDict, "state_dict_metadata");
    for (const auto& [k, v] : sdm.pairs) {
      Entry e;
      e.fqn = str(k, "a state_dict_metadata key");
      const Object& inst = expect(v, Object::kInstance, e.fqn);
      if (inst.cls == std::string(kMetadataModule) + ".BytesStorageMetadata") {
        auto it = where_bytes.find(e.fqn);
        if (it == where_bytes.end()) throw fail(e.fqn + " has no storage record");
        e.bytes = it->second;
      } else {
        const Object& tsm =
            instance_state(v, std::string(kMetadataModule) + ".TensorStorageMetadata", e.fqn);
        e.is_tensor = true;
        e.dtype = dtype(tsm.find("properties"), e.fqn);
        e.size = size(tsm.find("size"), e.fqn + ".size");
        const Object& chunks = expect(tsm.find("chunks"), Object::kList, e.fqn + ".chunks");
        for (const Object* c : chunks.items) {
          const Object& cs = instance_state(
              c, std::string(kMetadataModule) + ".ChunkStorageMetadata", e.fqn + "'s chunk");
          Chunk chunk;
          chunk.offsets = size(cs.find("offsets"), e.fqn + "'s chunk offsets");
          chunk.sizes = size(cs.find("sizes"), e.fqn + "'s chunk sizes");
          if (chunk.offsets.size() != e.size.size() || chunk.sizes.size() != e.size.size()) {
            throw fail(e.fqn + " has a chunk of another rank than the tensor");
          }
          for (size_t d = 0; d < e.size.size(); ++d) {
            if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 ||
                chunk.offsets[d] + chunk.sizes[d] > e.size[d]) {
              throw fail(e.fqn + " has a chunk outside the tensor");
            }
          }
          auto it = where.find({e.fqn, chunk.offsets});
          if (it == where.end()) {
            throw fail(fmt::format("{}'s chunk at [{}] has no storage record", e.fqn,
                                   fmt::join(chunk.offsets, ", ")));
          }
          chunk.storage = it->second;
          e.chunks.push_back(std::move(chunk));
        }
      }
      if (planner && planner->kind == Object::kDict) {
        if (const Object* p = planner->find(e.fqn); p && p->kind == Object::kTuple) {
          for (const Object* part : p->items) {
            if (part->kind == Object::kStr) {
              e.path.emplace_back(part->s);
            } else if (part->kind == Object::kInt) {
              e.path.emplace_back(part->i);
            } else {
              throw fail(e.fqn + "'s planner path holds a " + pickle::kind_name(part->kind));
            }
          }
        }
      }
      md.entries.push_back(std::move(e));
    }
    return md;
  }

  // TensorProperties' state: (dtype, layout, requires_grad, memory format, pin_memory).
  std::string dtype(const Object* o, const std::string& fqn) const {
    const Object& inst = expect(o, Object::kInstance, fqn + ".properties");
    if (inst.cls != std::string(kMetadataModule) + ".TensorProperties") {
      throw fail(fqn + ".properties is a " + inst.cls);
    }
    const Object* st = inst.state;
    const Object* dt = nullptr;
    const Object* layout = nullptr;
    if (st && st->kind == Object::kTuple && st->items.size() >= 2) {
      dt = st->items[0];
      layout = st->items[1];
    } else if (st && st->kind == Object::kDict) {  // written without __getstate__
      dt = st->find("dtype");
      layout = st->find("layout");
    }
    const Object& g = expect(dt, Object::kGlobal, fqn + "'s dtype");
    if (g.s.rfind("torch.", 0) != 0) throw fail(fqn + "'s dtype is " + g.s);
    if (layout &&
        !(layout->kind == Object::kInstance && layout->items.size() == 1 &&
          layout->items[0]->kind == Object::kStr && layout->items[0]->s == "torch.strided") &&
        !(layout->kind == Object::kGlobal && layout->s == "torch.strided")) {
      throw fail(fqn + " is not a strided (dense) tensor; ddp reads dense tensors only");
    }
    return g.s.substr(6);
  }

 private:
  const std::string& source_;
};

}  // namespace

Metadata decode(const std::string& bytes, const std::string& source) {
  auto doc = pickle::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), source);
  return Decoder(source).run(*doc.root);
}

}  // namespace ddp::dcp
