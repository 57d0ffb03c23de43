#include "executor/component_seconds.hpp"

namespace longseq {

ComponentSeconds& component_seconds() {
  static ComponentSeconds totals;
  return totals;
}

}  // namespace longseq
