// Reading a job's TensorBoard event files in tests, through the independent
// reader (tensorboard/read_events.py: Python, its own CRC-32C, the protos).
#ifndef PSTRAIN_TESTS_TENSORBOARD_FILES_H_
#define PSTRAIN_TESTS_TENSORBOARD_FILES_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/file_util.h"

namespace pstrain {

struct EventFile {
  std::string path;
  bool read = false;  // the reader ran and every record's CRCs held
  std::string file_version;
  std::map<std::string, std::vector<std::pair<int64_t, float>>> scalars;  // tag -> (step, value)
  std::map<std::string, std::string> text;
  int64_t partial_tail_bytes = 0;
};

inline bool HaveEventReader() {
  return std::system("/usr/bin/python3 -c 'import crc32c, google.protobuf' 2>/dev/null") == 0;
}

// The event files directly in `dir` (one run), each read. Needs the data
// tensorboard/read_events.py and proto/tensorboard.proto, and the working
// directory at the workspace root (Bazel's runfiles).
inline std::vector<EventFile> ReadRun(const std::string& dir) {
  std::vector<EventFile> out;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string path = entry.path().string();
    if (path.find("tfevents") == std::string::npos) continue;
    EventFile f;
    f.path = path;
    const std::string json_path = path + ".read.json";
    const std::string cmd = "/usr/bin/python3 tensorboard/read_events.py . '" + path + "' > '" + json_path + "'";
    f.read = std::system(cmd.c_str()) == 0;
    const nlohmann::json j = nlohmann::json::parse(ReadFile(json_path).value_or("{}"), nullptr, false);
    std::filesystem::remove(json_path);
    if (!f.read || j.is_discarded() || !j.contains("files")) {
      ADD_FAILURE() << "the reader refused " << path << ": " << j.dump();
      f.read = false;
      out.push_back(f);
      continue;
    }
    const auto& file = j["files"][0];
    f.partial_tail_bytes = file["partial_tail_bytes"];
    for (const auto& e : file["events"]) {
      if (e.contains("file_version")) f.file_version = e["file_version"];
      if (e.contains("scalars")) {
        for (auto& [tag, v] : e["scalars"].items()) f.scalars[tag].emplace_back(e["step"], v.get<float>());
      }
      if (e.contains("text")) {
        for (auto& [tag, v] : e["text"].items()) f.text[tag] = v;
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_TENSORBOARD_FILES_H_
