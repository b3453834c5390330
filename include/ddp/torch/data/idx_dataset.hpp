#pragma once
// MNIST-format datasets (MNIST, Fashion-MNIST) read from IDX files into a TensorDataset,
// normalised like the tutorial's transforms.Compose([ToTensor(), Normalize((0.1307,),
// (0.3081,))]): pixels become float32 in [0, 1], then (x - mean) / std.
//
// Layout: data is float32 [N, 1, rows, cols], target is int64 [N] (class labels).

#include <string>

#include "ddp/torch/data/tensor_dataset.hpp"

namespace ddp {

enum class MnistSplit { kTrain, kTest };

struct MnistOptions {
  static constexpr const char* kDirectory = "/usr/share/datasets/fashion-mnist";
  static constexpr double kMean = 0.1307;
  static constexpr double kStd = 0.3081;

  MnistOptions& directory(std::string v) {
    directory_ = std::move(v);
    return *this;
  }
  MnistOptions& split(MnistSplit v) {
    split_ = v;
    return *this;
  }
  MnistOptions& normalize(bool v) {
    normalize_ = v;
    return *this;
  }
  MnistOptions& mean(double v) {
    mean_ = v;
    return *this;
  }
  MnistOptions& std(double v) {
    std_ = v;
    return *this;
  }

  std::string directory_ = kDirectory;
  MnistSplit split_ = MnistSplit::kTrain;
  bool normalize_ = true;
  double mean_ = kMean;
  double std_ = kStd;
};

// The split's image and label files: <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte,
// with ".gz" when that file exists (else the unpacked name).
std::string mnist_images_path(const MnistOptions& options);
std::string mnist_labels_path(const MnistOptions& options);

// Loads one split. Throws UsageError naming the file and the problem when a file is missing,
// truncated or not IDX, when images are not uint8 [N, rows, cols], labels not uint8 [N], the
// counts differ.
TensorDataset load_mnist(const MnistOptions& options = MnistOptions());

}  // namespace ddp
