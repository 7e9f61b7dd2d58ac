// One evaluation as the CLI prints it: accuracy for classifiers, AUC and
// log loss for click-through models (model: dlrm).
#ifndef PSTRAIN_CLIENT_EVAL_TEXT_H_
#define PSTRAIN_CLIENT_EVAL_TEXT_H_

#include <string>

#include "absl/strings/str_format.h"
#include "proto/control.pb.h"

namespace pstrain {

inline std::string EvalText(const EpochEval& e) {
  if (e.auc() > 0) return absl::StrFormat("test AUC %.4f, log loss %.4f", e.auc(), e.log_loss());
  return absl::StrFormat("test accuracy %.4f, test loss %.4f", e.accuracy(), e.test_loss());
}

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_EVAL_TEXT_H_
