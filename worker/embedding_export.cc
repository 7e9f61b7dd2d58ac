#include "worker/embedding_export.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/weights_file.h"
#include "embedding/embedding_files.h"
#include "embedding/embedding_table.h"

namespace pstrain {

absl::Status ExportEmbeddings(const std::vector<std::vector<std::string>>& chain, const std::string& out) {
  if (chain.empty() || chain.back().empty()) return absl::InvalidArgumentError("no embedding checkpoint files to export");
  auto read = ReadEmbeddingFiles(chain);
  if (!read.ok()) return read.status();
  const std::vector<std::unique_ptr<EmbeddingTable>>& tables = *read;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& table : tables) {
    std::vector<std::pair<int64_t, std::vector<float>>> rows;
    absl::Status s = table->ForEachRow([&](const EmbeddingRowView& r) {
      rows.emplace_back(r.id, std::vector<float>(r.value, r.value + table->dim()));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const int64_t n = static_cast<int64_t>(rows.size());
    at::Tensor ids = at::empty({n}, at::kLong);
    at::Tensor weights = at::empty({n, table->dim()}, at::kFloat);
    for (int64_t i = 0; i < n; ++i) {
      ids.data_ptr<int64_t>()[i] = rows[i].first;
      std::memcpy(weights.data_ptr<float>() + i * table->dim(), rows[i].second.data(), sizeof(float) * table->dim());
    }
    named.emplace_back(absl::StrCat(table->config().name(), ".ids"), ids);
    named.emplace_back(absl::StrCat(table->config().name(), ".weights"), weights);
  }
  return SaveWeights(named, out);
}

}  // namespace pstrain
