#include "ddp/torch/data/idx_dataset.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include "ddp/torch/data/idx_format.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string split_file(const MnistOptions& o, const char* kind) {
  const std::string base = fmt::format("{}/{}-{}-ubyte", o.directory_,
                                       o.split_ == MnistSplit::kTrain ? "train" : "t10k", kind);
  // Prefer the packed file (Debian ships .gz); fall back to an unpacked copy. When neither
  // exists the .gz name is reported by the reader's error.
  if (file_exists(base + ".gz") || !file_exists(base)) return base + ".gz";
  return base;
}

}  // namespace

std::string mnist_images_path(const MnistOptions& options) {
  return split_file(options, "images-idx3");
}
std::string mnist_labels_path(const MnistOptions& options) {
  return split_file(options, "labels-idx1");
}

TensorDataset load_mnist(const MnistOptions& options) {
  const std::string images_path = mnist_images_path(options);
  const std::string labels_path = mnist_labels_path(options);
  IdxArray images = read_idx_file(images_path);
  IdxArray labels = read_idx_file(labels_path);

  if (images.type_code != 0x08 || images.dims.size() != 3) {
    throw UsageError(
        fmt::format("{}: expected uint8 images [N, rows, cols] (magic 0x00000803), "
                    "got type 0x{:02x} with {} dimensions; is this a labels file?",
                    images_path, images.type_code, images.dims.size()));
  }
  if (labels.type_code != 0x08 || labels.dims.size() != 1) {
    throw UsageError(
        fmt::format("{}: expected uint8 labels [N] (magic 0x00000801), got type "
                    "0x{:02x} with {} dimensions; is this an images file?",
                    labels_path, labels.type_code, labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    throw UsageError(
        fmt::format("{} holds {} images but {} holds {} labels; the files belong "
                    "to different splits or datasets",
                    images_path, images.dims[0], labels_path, labels.dims[0]));
  }

  const int64_t n = images.dims[0];
  auto pixels = torch::from_blob(images.data.data(), {n, 1, images.dims[1], images.dims[2]},
                                 torch::kUInt8)
                    .to(torch::kFloat32)
                    .div_(255.0);                                         // ToTensor
  if (options.normalize_) pixels.sub_(options.mean_).div_(options.std_);  // Normalize
  auto targets = torch::from_blob(labels.data.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return TensorDataset(pixels, targets);
}

}  // namespace ddp
