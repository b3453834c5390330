#pragma once
// Reading files written by Python's torch.save (zip format, pickle protocol 2), which
// LibTorch 1.13's own torch::pickle_load cannot read in general: its unpickler lacks SETITEM
// and APPEND (any one-entry dict or list), OrderedDict's BUILD (every state_dict) and
// torch._utils._rebuild_parameter (nn.Parameter).
//
// Supported: None, bool, int (up to 64 bits), float, str, bytes, tuple, list, dict (str or
// int keys), OrderedDict (its _metadata is dropped), tensors of every plain dtype (with
// offsets, strides and shared storages), nn.Parameter (as its tensor), torch.device (as its
// string). Anything else, e.g. a pickled Python class, is a UsageError naming the global: no
// code from the file is ever run. Malformed input is a UsageError naming `source`, never a
// crash or an over-read, so the parser is safe to fuzz.
//
// The result is a c10::IValue: dicts are GenericDicts (string or int keys), lists and tuples
// are GenericLists / Tuples, tensors are CPU tensors.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp {

// The bytes of zip record "data/<key>" (a tensor storage). Throws when absent.
using StorageLoader = std::function<std::vector<uint8_t>(const std::string& key)>;

// Parses a pickle stream (the archive's data.pkl).
c10::IValue parse_torch_pickle(const uint8_t* bytes, size_t size, const StorageLoader& storages,
                               const std::string& source);

// Parses a whole torch.save / torch::pickle_save zip archive held in memory.
c10::IValue torch_load_bytes(const std::vector<char>& zip, const std::string& source);

}  // namespace ddp
