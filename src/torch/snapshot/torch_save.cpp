#include "ddp/torch/snapshot/torch_save.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace ddp {

void write_torch_save(const c10::IValue& value, const ByteSink& sink) {
  // torch::jit::pickle_save's steps, with tag_aggregates off.
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  caffe2::serialize::PyTorchStreamWriter writer(sink);
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
}

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  std::vector<char> archive;
  write_torch_save(value, [&](const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  return archive;
}

}  // namespace ddp
