#include "rpc/token_table.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

constexpr size_t kMaxFileBytes = 1 << 20;
constexpr size_t kMaxUserLength = 128;

std::array<unsigned char, 32> Digest(absl::string_view token) {
  std::array<unsigned char, 32> d;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  return d;
}

// Splits one CSV line into fields; a field may be double-quoted (the groups
// column is: "a,b"). No escapes: the format has none.
absl::StatusOr<std::vector<std::string>> SplitCsv(absl::string_view line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back().push_back(c);
    }
  }
  if (quoted) return absl::InvalidArgumentError("unterminated quote");
  for (auto& f : fields) f = std::string(absl::StripAsciiWhitespace(f));
  return fields;
}

bool ValidUser(absl::string_view user) {
  if (user.empty() || user.size() > kMaxUserLength) return false;
  for (char c : user) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != '@' &&
        c != ':') {
      return false;
    }
  }
  return true;
}

// The operator's file, not a client's name: symbolic links are followed
// (a Kubernetes Secret volume is one).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto contents = ReadFile(path);
  if (contents.ok() && contents->size() > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is larger than ", kMaxFileBytes, " bytes"));
  }
  return contents;
}

std::string FileIdentity(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec);
}

}  // namespace

absl::string_view BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kPrefix = "Bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kPrefix)) return {};
  return absl::StripAsciiWhitespace(authorization.substr(kPrefix.size()));
}

absl::StatusOr<std::vector<TokenTable::Row>> TokenTable::Parse(absl::string_view contents,
                                                               const std::string& source) {
  std::vector<Row> rows;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat(source, " line ", line_number);
    auto fields = SplitCsv(line);
    if (!fields.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", fields.status().message()));
    if (fields->size() < 3 || fields->size() > 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected token,user,uid[,\"groups\"] (", fields->size(), " fields)"));
    }
    const std::string& token = (*fields)[0];
    const std::string& user = (*fields)[1];
    if (token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the token is shorter than ", kMinTokenLength, " characters"));
    }
    if (!ValidUser(user)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the user name must be 1-", kMaxUserLength, " of [A-Za-z0-9._@:-]"));
    }
    Row row{Digest(token), Caller{CallerRole::kUser, user}};
    if (fields->size() == 4) {
      std::optional<CallerRole> member;
      for (absl::string_view group : absl::StrSplit((*fields)[3], ',', absl::SkipWhitespace())) {
        group = absl::StripAsciiWhitespace(group);
        std::optional<CallerRole> role;
        if (group == kClusterGroup) role = CallerRole::kCluster;
        if (group == kShardGroup) role = CallerRole::kShard;
        if (group == kWorkerGroup) role = CallerRole::kWorker;
        if (group == kCoordinatorGroup) role = CallerRole::kCoordinator;
        if (role.has_value() && member.has_value() && *member != *role) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": a token has one member role, this row names ",
                                                         CallerRoleName(*member), " and ", CallerRoleName(*role)));
        }
        if (role.has_value()) member = role;
        if (group == kAdminGroup) row.caller.role = CallerRole::kAdmin;
      }
      if (member.has_value() && row.caller.role != CallerRole::kAdmin) row.caller.role = *member;
    }
    for (const Row& other : rows) {
      if (CRYPTO_memcmp(other.digest.data(), row.digest.data(), row.digest.size()) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": the same token appears twice"));
      }
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  return rows;
}

absl::StatusOr<std::shared_ptr<TokenTable>> TokenTable::Load(const std::string& path) {
  auto contents = ReadTokenFile(path);
  if (!contents.ok()) return contents.status();
  auto rows = Parse(*contents, path);
  if (!rows.ok()) return rows.status();
  std::shared_ptr<TokenTable> table(new TokenTable(path));
  absl::MutexLock lock(&table->mu_);
  table->rows_ = std::move(*rows);
  table->file_identity_ = FileIdentity(path);
  table->checked_ = absl::Now();
  return table;
}

void TokenTable::MaybeReload() {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - checked_ < absl::Seconds(1)) return;
    checked_ = now;
    if (FileIdentity(path_) == file_identity_) return;
  }
  // Read outside the lock; a racing reload of the same file is harmless.
  const std::string identity = FileIdentity(path_);
  auto contents = ReadTokenFile(path_);
  absl::StatusOr<std::vector<Row>> rows =
      contents.ok() ? Parse(*contents, path_) : absl::StatusOr<std::vector<Row>>(contents.status());
  absl::MutexLock lock(&mu_);
  file_identity_ = identity;
  if (!rows.ok()) {
    spdlog::error("token file changed but cannot be used, keeping the previous tokens: {}",
                  rows.status().ToString());
    return;
  }
  spdlog::info("token file {} reloaded: {} tokens", path_, rows->size());
  rows_ = std::move(*rows);
}

std::optional<Caller> TokenTable::Find(absl::string_view token) {
  if (token.empty()) return std::nullopt;
  MaybeReload();
  const auto digest = Digest(token);
  absl::MutexLock lock(&mu_);
  const Row* found = nullptr;
  for (const Row& row : rows_) {  // every row, whatever matched: constant time
    if (CRYPTO_memcmp(row.digest.data(), digest.data(), digest.size()) == 0) found = &row;
  }
  if (found == nullptr) return std::nullopt;
  return found->caller;
}

size_t TokenTable::size() {
  absl::MutexLock lock(&mu_);
  return rows_.size();
}

}  // namespace pstrain
