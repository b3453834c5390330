#include "ddp/torch/snapshot/torch_pickle.hpp"

// The torch.save reader: the archive's records, its data.pkl parsed by the one pickle parser
// (pickle/unpickler.hpp) into torch values (torch_pickle_builder.hpp), then converted to an
// IValue (pickle_to_ivalue.hpp).

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>

#include <memory>
#include <tuple>

#include "../pickle/unpickler.hpp"
#include "ddp/util/error.hpp"
#include "pickle_to_ivalue.hpp"
#include "torch_pickle_builder.hpp"

namespace ddp {

c10::IValue parse_torch_pickle(const uint8_t* bytes, size_t size, const StorageLoader& storages,
                               const std::string& source) {
  pickle::Cursor in(bytes, size, source, "torch.save pickle");
  torch_pickle::TorchPickleBuilder builder(in, storages);
  torch_pickle::NodePtr root =
      pickle::Unpickler<torch_pickle::TorchPickleBuilder>(in, builder).run();
  return torch_pickle::to_ivalue(root, source);
}

c10::IValue torch_load_bytes(const std::vector<char>& zip, const std::string& source) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(zip.data(), zip.size()));
  } catch (const c10::Error& e) {
    throw UsageError(
        fmt::format("{}: not a torch.save zip archive ({}); is it truncated or a "
                    "legacy (pre-1.6) torch.save file?",
                    source, e.what_without_backtrace()));
  }
  auto record = [&](const std::string& name) {
    try {
      at::DataPtr data;
      size_t n = 0;
      std::tie(data, n) = reader->getRecord(name);
      const auto* p = static_cast<const uint8_t*>(data.get());
      return std::vector<uint8_t>(p, p + n);
    } catch (const c10::Error& e) {
      throw UsageError(fmt::format("{}: cannot read record {} of the zip archive: {}", source, name,
                                   e.what_without_backtrace()));
    }
  };
  const std::vector<uint8_t> pkl = record("data.pkl");
  return parse_torch_pickle(
      pkl.data(), pkl.size(), [&](const std::string& key) { return record("data/" + key); },
      source);
}

}  // namespace ddp
