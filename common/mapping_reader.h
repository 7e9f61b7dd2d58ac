// MappingReader: reads one mapping of a YAML job spec into C++ fields,
// refusing unknown keys and values of the wrong type with the full path of
// the field ("optimizer.lr", "embeddings.tables[1].dim"). Private to the job
// spec's parser (job_spec.cc, embedding_spec.cc). Not thread-safe; a reader
// refers to its node for its life.
#ifndef PSTRAIN_COMMON_MAPPING_READER_H_
#define PSTRAIN_COMMON_MAPPING_READER_H_

#include <yaml-cpp/yaml.h>

#include <functional>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/quote.h"

namespace pstrain {

// Reads one YAML mapping into C++ fields, refusing unknown keys and values of
// the wrong type with the full path of the field ("optimizer.lr").
class MappingReader {
 public:
  MappingReader(const YAML::Node& node, std::string path, std::string origin)
      : node_(node), path_(std::move(path)), origin_(std::move(origin)) {}

  absl::Status Check() const {
    if (!node_.IsMap()) return Error(path_.empty() ? "the top level" : path_, "must be a mapping");
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (known_.count(key) == 0) {
        std::vector<std::string> names(known_.begin(), known_.end());
        return Error(Full(key), absl::StrCat("is not a known field (known here: ",
                                             absl::StrJoin(names, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Read(const std::string& key, T* out) {
    known_.insert(key);
    const YAML::Node v = node_[key];
    if (!v) return absl::OkStatus();
    if (!v.IsScalar()) return Error(Full(key), "must be a single value");
    try {
      *out = v.as<T>();
    } catch (const YAML::Exception&) {
      return Error(Full(key), absl::StrCat("has the wrong type: '", v.Scalar(), "'"));
    }
    return absl::OkStatus();
  }

  // One of `names` (an enumerated field): refused with the list otherwise.
  template <typename E>
  absl::Status ReadEnum(const std::string& key, std::initializer_list<std::pair<const char*, E>> names, E* out) {
    std::string value;
    absl::Status s = Read(key, &value);
    if (!s.ok() || !node_[key]) return s;  // absent: the default stands
    std::vector<std::string> known;
    for (const auto& [name, e] : names) {
      if (value == name) {
        *out = e;
        return absl::OkStatus();
      }
      known.push_back(name);
    }
    return Error(Full(key), absl::StrCat("is '", Quote(value, 64), "': must be ", absl::StrJoin(known, ", ")));
  }

  // A nested mapping (may be absent).
  absl::Status Nested(const std::string& key,
                      const std::function<absl::Status(MappingReader&)>& fn) {
    known_.insert(key);
    const YAML::Node v = node_[key];
    if (!v) return absl::OkStatus();
    MappingReader inner(v, Full(key), origin_);
    if (!v.IsMap()) return Error(Full(key), "must be a mapping");
    absl::Status s = fn(inner);
    if (!s.ok()) return s;
    return inner.Check();
  }

  // A key this mapping may hold, read by the caller from node() itself.
  void Known(const std::string& key) { known_.insert(key); }
  bool Has(const std::string& key) const { return static_cast<bool>(node_[key]); }
  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }
  const std::string& origin() const { return origin_; }

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(origin_, ": ", field, " ", what));
  }
  std::string Full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  YAML::Node node_;
  std::string path_;
  std::string origin_;
  std::set<std::string> known_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_MAPPING_READER_H_
