#include "checkpoint/pause_keys.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

// The names are part of the protocol between worker and coordinator
// binaries of possibly different builds: they must not drift.
TEST(PauseKeysTest, SpelledAsOnTheWire) {
  EXPECT_EQ(PauseVotesKey(7), "pause/7/votes");
  EXPECT_EQ(PauseStepKey(7), "pause/7/step");
  EXPECT_EQ(CheckpointPathKey(12345678901234), "ckpt/12345678901234/path");
  EXPECT_EQ(CheckpointSavedKey(12345678901234), "ckpt/12345678901234/saved");
  EXPECT_EQ(CheckpointBuffersPathKey(3), "ckpt/3/buffers_path");
  EXPECT_EQ(CheckpointBuffersSavedKey(3), "ckpt/3/buffers_saved");
}

}  // namespace
}  // namespace pstrain
