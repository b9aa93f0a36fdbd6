// The rollout harness: runs the baseline and ReplaySSM side by side with the fp64 oracle over many
// decode steps, on any backend, and checks every step (outputs, caches, checkpoint, cursors, and
// that nothing else was touched).
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "replayssm/mamba2.hpp"
#include "support/buffer.hpp"
#include "support/host_tensor.hpp"

namespace replayssm::test {

struct Geometry {
  const char* name;
  int64_t nheads, head_dim, state_dim, ngroups;  // H, P, N, G
};

inline constexpr Geometry kNemotronH{"nemotronh", 128, 64, 128, 8};
inline constexpr Geometry kMamba2_2p7b{"mamba2_2p7b", 80, 64, 128, 1};
inline constexpr Geometry kNemotronNano4b{"nemotronnano4b", 96, 80, 128, 8};
inline constexpr Geometry kOddGrouped{"odd6x5x7g3", 6, 5, 7, 3};
inline constexpr Geometry kOddWideState{"odd4x3x33g1", 4, 3, 33, 1};
inline constexpr Geometry kSmall{"small8x16x32g2", 8, 16, 32, 2};
// The vectorised layouts' other state dims (N = 64 and 256), with head dims of 80 (no multiple of
// the CUDA kernels' chunks) and 128.
inline constexpr Geometry kVectorisedN64{"vec8x80x64g2", 8, 80, 64, 2};
inline constexpr Geometry kVectorisedN256{"vec4x128x256g2", 4, 128, 256, 2};
// One head a group: the speculative window kernel's grid is a CTA of one warp per (row, group),
// so a few dozen rows give more CTAs than a GPU holds at once.
inline constexpr Geometry kOneHeadGroups{"heads64x16x128g64", 64, 16, 128, 64};

enum class SlotMapping {
  kShuffled,  // state_batch_indices: a fresh permutation of rows every step, pad rows included
  kIdentity,  // state_batch_indices absent (row i uses slot i) once every request has started
};

struct RolloutConfig {
  Backend backend = Backend::kCpu;
  Geometry geometry = kOddGrouped;
  int64_t buffer_len = 16;  // L
  ReplayRoute route = ReplayRoute::kAuto;
  DType state_dtype = DType::kFloat32;  // 8-bit: replay only, the baseline has no such state
  DType act_dtype = DType::kFloat32;
  bool stochastic_rounding = false;
  bool dt_float32 = false;              // dt in fp32 instead of the activation dtype
  DType param_dtype = DType::kFloat32;  // A, D, dt_bias
  bool with_D = true;
  bool with_z = true;
  bool with_dt_bias = true;
  bool dt_softplus = true;
  bool dt_per_channel = false;  // dt as (batch, H, P) with stride 0; D, dt_bias as (H, P)
  bool A_per_element = false;   // A as (H, P, N) with zero strides
  bool packed_xbc = false;      // x, B, C: column slices of one (batch, H*P + 2*G*N) buffer
  bool workspace = false;       // CUDA: a workspace and WindowKernel::kSeparate (the split path)
  bool expect_split_path = false;  // with workspace: the call must take the split path (write it)
  SlotMapping mapping = SlotMapping::kShuffled;
  int64_t requests = 4;       // rows that carry a request
  int64_t pad_rows = 1;       // rows that are always padding (kShuffled only)
  int64_t foreign_slots = 2;  // slots no row ever uses
  int64_t steps = 0;          // 0: enough for the last request to start and run 3 windows
  int64_t recycles = 1;       // slots handed to a new request mid-run
  int64_t pad_slot_id = -1;
  uint64_t seed = 1;

  // A readable test name: geometry, L, route, dtypes, then what differs from the defaults.
  std::string name() const;
};

// How GoogleTest prints a config (test parameters, failure messages).
void PrintTo(const RolloutConfig& config, std::ostream* os);

// What a rollout checks; a failure is counted under one of these.
enum class Check : int {
  kOutputError,           // out vs the fp64 oracle
  kOutputNotWritten,      // a non-pad row of out kept its canary
  kPadRowWritten,         // a pad row of out lost its canary
  kCache,                 // x_cache / B_cache / dt_cache differ from the expected contents
  kCheckpointTouched,     // the checkpoint of a slot that did not flush changed
  kFlushedCheckpoint,     // a flushed checkpoint vs the exact state
  kCursor,                // cursors differ from the expected values
  kBaselineStateTouched,  // the baseline wrote the state of a slot no row used
  kFlushCounts,           // flush_counts differ from the flushes of each slot
  kSplitPathNotTaken,     // expect_split_path, and the workspace was never written
  kCount,
};

const char* check_name(Check check);

struct Report {
  int64_t steps = 0;
  int64_t flush_rows = 0;     // (row, step) pairs that flushed and had their checkpoint checked
  int64_t nonflush_rows = 0;  // (row, step) pairs that appended to the buffer
  int64_t recycled_slots = 0;
  // max over steps of (max |out - oracle| beyond the output rounding) / max |oracle out|
  double max_replay_error = 0;
  double max_baseline_error = 0;
  // max over flushes of max |checkpoint - oracle state| / max |oracle state| (fp32 state only)
  double max_checkpoint_error = 0;
  int64_t failures[int(Check::kCount)] = {};
  std::vector<std::string> messages;  // the first failures, for the log

  void fail(Check check, const std::string& message);
  int64_t failure_count(Check check) const { return failures[int(check)]; }
  bool passed() const;
  std::string summary() const;
};

class Rollout {
 public:
  explicit Rollout(const RolloutConfig& config);

  // Runs the remaining steps (checking each, then the rollout as a whole) / one step, checking
  // it; failures go to report().
  void run();
  void step();
  bool done() const { return step_ >= total_steps_; }

  const RolloutConfig& config() const { return config_; }
  const Report& report() const { return report_; }

  // The tensors under test and what the harness expects them to hold, for tests that tamper with
  // them to prove that the checks notice.
  Buffer& checkpoint() { return checkpoint_; }  // (slots, H, P, N) state dtype
  Buffer& x_cache() { return x_cache_; }        // (slots, H, L, P) act
  Buffer& cursors() { return cursors_; }        // (slots) int32
  const std::vector<int32_t>& expected_cursors() const { return expected_cursors_; }
  // The slot of a started request with at least one token buffered, or -1.
  int64_t slot_with_history() const;

 private:
  struct StepInputs;

  void initialise_parameters();
  HostTensor random_state();   // (H, P, N) state dtype: the stored values
  HostTensor random_scales();  // (H, P) fp32: their scales (8-bit), else empty
  void write_initial_state(int64_t slot, const HostTensor& state, const HostTensor& scales);
  bool has_baseline() const { return !is_scaled_checkpoint(config_.state_dtype); }
  void recycle_one_slot();
  void reset_cursors(const std::vector<int32_t>& slots);
  void choose_rows(StepInputs& in);
  void generate_inputs(StepInputs& in);
  void upload_inputs(const StepInputs& in);
  Mamba2Step step_under_test(const StepInputs& in, const Buffer& out) const;
  Mamba2Step step_for_oracle(StepInputs& in, HostTensor& out);
  void record_expected_caches(const StepInputs& in, const std::vector<bool>& flushes);
  void advance_expected_cursors(const StepInputs& in);
  void check_outputs(const StepInputs& in, const HostTensor& out, const HostTensor& baseline_out,
                     const HostTensor& oracle_out);
  void check_canaries(const StepInputs& in, const HostTensor& out, const char* what);
  void check_caches();
  void check_replay_against_checkpoint(const StepInputs& in, const HostTensor& out,
                                       const HostTensor& window_out);
  void check_checkpoint(const StepInputs& in, const std::vector<bool>& flushes,
                        const HostTensor& before, const HostTensor& after,
                        const HostTensor& scale_before, const HostTensor& scale_after);
  void check_flush_counts(const StepInputs& in, const std::vector<bool>& flushes);
  void check_cursors();
  void check_rollout_error();
  void check_split_path();
  void check_baseline_state(const StepInputs& in, const HostTensor& before, const HostTensor& after);

  RolloutConfig config_;
  int64_t H_, P_, N_, G_, L_, batch_, slots_;
  int64_t total_steps_ = 0;
  int64_t step_ = 0;
  DType dt_dtype_;
  Device device_;
  std::mt19937_64 rng_;
  Report report_;

  // Requests: slot and first step of each; slots recycled at the listed steps.
  std::vector<int64_t> request_slot_, request_start_;
  int64_t last_start_ = 0;
  std::vector<int64_t> recycle_steps_;
  int64_t next_recycle_request_ = 0;

  // Parameters (H) in the parameter dtype, and the same values in fp32 for the oracle.
  Buffer A_, D_, dt_bias_;
  HostTensor A32_, D32_, dt_bias32_;

  // Under test.
  Buffer baseline_state_, checkpoint_;  // (slots, H, P, N) state dtype
  Buffer checkpoint_scale_;             // (slots, H, P) fp32: 8-bit checkpoints only
  Buffer rounding_seed_;                // (2) int32: stochastic rounding only
  Buffer flush_counts_;                 // (slots) int32: stochastic rounding only
  Buffer x_cache_;                      // (slots, H, L, P) act
  Buffer B_cache_;                      // (slots, G, L, N) act
  Buffer dt_cache_;                     // (slots, H, L) fp32
  Buffer cursors_;                      // (slots) int32
  Buffer x_, z_, out_, baseline_out_;   // (batch, H, P) act
  Buffer B_, C_;                        // (batch, G, N) act
  Buffer xbc_;                          // (batch, H*P + 2*G*N) act: x, B, C when packed
  Buffer dt_;                           // (batch, H) dt dtype
  Buffer indices_;                      // (batch) int32
  Buffer reset_slots_;                  // (n) int32: the last replay_reset's slots
  Buffer workspace_;                    // replay_decode's scratch (config.workspace)

  // fp64 oracles (slots, H, P, N): the exact state of every slot, and the exact state since each
  // slot's last checkpoint (restarted from the checkpoint as stored at each flush).
  HostTensor oracle_state_, window_oracle_state_;

  // What the caches and cursors must hold (shapes as above).
  HostTensor expected_x_cache_, expected_B_cache_, expected_dt_cache_;
  std::vector<int32_t> expected_cursors_;
  std::vector<int32_t> expected_flush_counts_;  // (slots): stochastic rounding only
};

}  // namespace replayssm::test
