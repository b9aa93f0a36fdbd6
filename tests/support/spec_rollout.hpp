// The speculative rollout harness: runs ReplaySSM's verify / commit and the baseline speculative
// path side by side with the fp64 oracle over many verify steps, on any backend, with random
// accepted counts, and checks every step (outputs, caches, checkpoints, rings, and that nothing
// else was touched).
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "replayssm/mamba2_spec.hpp"
#include "support/buffer.hpp"
#include "support/host_tensor.hpp"
#include "support/rollout.hpp"

namespace replayssm::test {

// How many tokens of a window are accepted (the bonus token included).
enum class Acceptance {
  kAll,        // every draft: k = n
  kBonusOnly,  // no draft: k = 1
  kMixed,      // per row and step: all, bonus only, or uniform in [1, n], a third each
};

struct SpecRolloutConfig {
  Backend backend = Backend::kCpu;
  Geometry geometry = kOddGrouped;
  int64_t window = 4;       // T
  int64_t buffer_len = 16;  // L
  DType state_dtype = DType::kFloat32;
  DType act_dtype = DType::kFloat32;
  Acceptance acceptance = Acceptance::kMixed;
  bool ragged = true;         // rows carry a random number of valid tokens in [1, T] per step
  int64_t requests = 4;       // rows that carry a request
  int64_t pad_rows = 1;       // rows that are always padding
  int64_t foreign_slots = 2;  // slots no row ever uses
  int64_t steps = 64;         // verify steps
  int64_t recycles = 1;       // slots handed to a new request mid-run
  // Row i uses slot i, and verify and commit get no state_batch_indices (the baseline still needs
  // its (batch, T) slots): every request starts at step 0 and there are no pad rows.
  bool identity_rows = false;
  int64_t pad_slot_id = -1;
  uint64_t seed = 1;
  bool workspace = false;  // CUDA: a workspace and WindowKernel::kSeparate (the split path)

  std::string name() const;
};

void PrintTo(const SpecRolloutConfig& config, std::ostream* os);

// What happened over a rollout besides the checks (Report): how the acceptance was spread.
struct AcceptanceCounts {
  int64_t all = 0;         // (row, step) pairs with every valid token accepted (n > 1)
  int64_t bonus_only = 0;  // only the first token accepted (n > 1)
  int64_t partial = 0;     // in between
};

class SpecRollout {
 public:
  explicit SpecRollout(const SpecRolloutConfig& config);

  void run();
  void step();
  bool done() const { return step_ >= config_.steps; }

  const SpecRolloutConfig& config() const { return config_; }
  const Report& report() const { return report_; }
  const AcceptanceCounts& acceptance() const { return acceptance_; }

  // The tensors under test, for tests that tamper with them.
  Buffer& checkpoint() { return checkpoint_; }  // (slots, H, P, N) state dtype
  Buffer& x_cache() { return x_cache_; }        // (slots, H, R, P) act
  Buffer& ring() { return ring_; }              // (slots, 2) int32
  // A started request's slot with committed inputs (its ring origin is a committed entry), or -1.
  int64_t slot_with_history() const;
  int32_t expected_origin(int64_t slot) const { return expected_ring_[size_t(2 * slot)]; }
  int32_t expected_committed(int64_t slot) const { return expected_ring_[size_t(2 * slot + 1)]; }

 private:
  struct StepInputs;

  HostTensor random_state();
  void write_initial_state(int64_t slot, const HostTensor& state);
  void reset_rings(const std::vector<int32_t>& slots);
  void recycle_one_slot();
  void choose_rows(StepInputs& in);
  void generate_inputs(StepInputs& in);
  // The window as the backend reads it; `baseline`: state_batch_indices (batch, T).
  Mamba2Window window_under_test(const Buffer& out, bool baseline) const;
  Mamba2Step oracle_position(StepInputs& in, int64_t t, HostTensor& indices, HostTensor& out);
  void record_expected_caches(const StepInputs& in);
  void check_canaries(const StepInputs& in, const HostTensor& out, const char* what);
  void check_outputs(const StepInputs& in, const HostTensor& out, const HostTensor& baseline_out,
                     const HostTensor& oracle_out);
  void check_checkpoints(const StepInputs& in, const HostTensor& before, const HostTensor& after);
  void check_caches();
  void check_ring();
  void check_rollout_error();

  SpecRolloutConfig config_;
  int64_t H_, P_, N_, G_, T_, L_, R_, batch_, slots_;
  int64_t step_ = 0;
  Device device_;
  std::mt19937_64 rng_;
  Report report_;
  AcceptanceCounts acceptance_;

  std::vector<int64_t> request_slot_, request_start_, recycle_steps_;
  int64_t next_recycle_request_ = 0;

  Buffer A_, D_, dt_bias_;              // (H) fp32
  HostTensor A32_, D32_, dt_bias32_;    // the same, for the oracle

  // ReplaySSM under test.
  Buffer workspace_;   // spec_verify's scratch (config.workspace)
  Buffer checkpoint_;  // (slots, H, P, N) state dtype
  Buffer x_cache_;     // (slots, H, R, P) act
  Buffer B_cache_;     // (slots, G, R, N) act
  Buffer dt_cache_;    // (slots, H, R) fp32
  Buffer ring_;        // (slots, 2) int32
  // The baseline under test: request slot s owns baseline slots s * T .. s * T + T - 1.
  Buffer baseline_state_;  // (slots * T, H, P, N) state dtype
  std::vector<int32_t> baseline_accepted_;  // (slots): the accepted count of the last commit

  // Window inputs and outputs.
  Buffer x_, z_, out_, baseline_out_;  // (batch, T, H, P) act
  Buffer B_, C_;                       // (batch, T, G, N) act
  Buffer dt_;                          // (batch, T, H) act
  Buffer valid_;                       // (batch) int32
  Buffer indices_;                     // (batch) int32
  Buffer baseline_indices_;            // (batch, T) int32
  Buffer accepted_, previous_accepted_;  // (batch) int32
  Buffer reset_slots_;                 // (n) int32

  // fp64 oracles (slots, H, P, N): each slot's state after its committed tokens, and the same
  // restarted from the checkpoint as stored at each flush.
  HostTensor oracle_state_, window_oracle_state_;
  HostTensor expected_x_cache_, expected_B_cache_, expected_dt_cache_;
  std::vector<int32_t> expected_ring_;  // (slots, 2)
};

}  // namespace replayssm::test
