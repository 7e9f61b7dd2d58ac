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
  // A pipelined job's stages: stage 0 keeps worker 0's keys.
  EXPECT_EQ(CheckpointPathKey(5, 0), "ckpt/5/path");
  EXPECT_EQ(CheckpointPathKey(5, 3), "ckpt/5/stage-3/path");
  EXPECT_EQ(CheckpointSavedKey(5, 12), "ckpt/5/stage-12/saved");
}

// Who may answer a save: worker s for stage s, worker 0 for the rest;
// nobody for a key that names no stage a job can have.
TEST(PauseKeysTest, EachSavedKeyHasOneWriter) {
  EXPECT_EQ(CheckpointSavedKeyWriter(CheckpointSavedKey(9)), 0);
  EXPECT_EQ(CheckpointSavedKeyWriter(CheckpointBuffersSavedKey(9)), 0);
  for (int s : {1, 2, 9, 10, 64}) EXPECT_EQ(CheckpointSavedKeyWriter(CheckpointSavedKey(9, s)), s) << s;
  for (const char* bad : {"ckpt/9/stage-65/saved", "ckpt/9/stage-0/saved", "ckpt/9/stage-01/saved",
                          "ckpt/9/stage-/saved", "ckpt/9/stage-+1/saved", "ckpt/9/stage- 1/saved",
                          "ckpt/9/stage-100/saved", "ckpt/9/stage-1/buffers_saved", "ckpt/9/stage-1x/saved"}) {
    EXPECT_EQ(CheckpointSavedKeyWriter(bad), -1) << bad;
    EXPECT_TRUE(IsCheckpointSavedKey(bad)) << bad;
  }
  EXPECT_TRUE(IsCheckpointPathKey(CheckpointPathKey(9, 4)));
}

}  // namespace
}  // namespace pstrain
