#pragma once
// torch_save_bytes: a value in torch.save's zip format that Python's plain `torch.load(path)`
// reads under its default `weights_only=True` (PyTorch 2.6 on).
//
// LibTorch's torch::pickle_save tags every dict and list with its static type through
// `torch.jit._pickle.restore_type_tag`, a global the weights-only unpickler refuses: such a file
// loads only with `weights_only=False`, which runs code from the file. This writes the same
// archive (data.pkl and one data/<i> record per tensor storage) with the containers untagged, so
// it holds nothing but dicts, lists, tuples, strings, numbers and tensors. LibTorch's
// torch::pickle_load and ddp's torch_load_bytes read it too.

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace ddp {

std::vector<char> torch_save_bytes(const c10::IValue& value);

// The same archive, handed to `sink` piece by piece as it is produced (no copy of the whole
// archive in memory). `sink` returns the bytes it took; fewer ends the archive with an error.
using ByteSink = std::function<size_t(const void* data, size_t size)>;
void write_torch_save(const c10::IValue& value, const ByteSink& sink);

}  // namespace ddp
