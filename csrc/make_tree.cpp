// Runtime dispatch from (fanout, value type) to a compiled KaryTree.
#include "hetero_replay/kary_tree.hpp"

namespace hetero_replay {

template <typename T>
static std::unique_ptr<SumTreeBase> make_typed(int64_t capacity, int fanout) {
  switch (fanout) {
    case 2: return std::make_unique<KaryTree<T, 2>>(capacity);
    case 4: return std::make_unique<KaryTree<T, 4>>(capacity);
    case 8: return std::make_unique<KaryTree<T, 8>>(capacity);
    case 16: return std::make_unique<KaryTree<T, 16>>(capacity);
    case 32: return std::make_unique<KaryTree<T, 32>>(capacity);
    case 64: return std::make_unique<KaryTree<T, 64>>(capacity);
    default:
      throw std::invalid_argument("fanout must be one of 2, 4, 8, 16, 32, 64; got " + std::to_string(fanout));
  }
}

std::unique_ptr<SumTreeBase> make_kary_tree(int64_t capacity, int fanout, bool float64) {
  return float64 ? make_typed<double>(capacity, fanout) : make_typed<float>(capacity, fanout);
}

}  // namespace hetero_replay
