// The public entry points: validate, then hand the flattened call to the chosen backend.
#include "replayssm/mamba2.hpp"

#include "api/validate.hpp"
#include "cpu/mamba2_cpu.hpp"
#include "reference/mamba2_reference.hpp"

namespace replayssm {
namespace {

[[noreturn]] void no_cuda() {
  throw InvalidArgument("replayssm: the CUDA backend has no kernels in this build");
}

}  // namespace

void selective_state_update(const TensorView& state, const Mamba2Step& step,
                            const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, state.device);
  const Mamba2Params p = validate_state_update(state, step, backend);
  switch (backend) {
    case Backend::kReference: return reference::selective_state_update(p);
    case Backend::kCuda:
      no_cuda();
    default: return cpu::selective_state_update(p);
  }
}

void replay_decode(const ReplayCache& cache, const Mamba2Step& step, ReplayRoute route,
                   const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, cache.state.device);
  const ReplayParams p = validate_replay_decode(cache, step, route, backend);
  switch (backend) {
    case Backend::kReference: return reference::replay_decode(p);
    case Backend::kCuda:
      no_cuda();
    default: return cpu::replay_decode(p);
  }
}

void replay_advance(const TensorView& cursors, int64_t buffer_len,
                    const TensorView& state_batch_indices, int64_t pad_slot_id,
                    const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, cursors.device);
  const CursorParams p =
      validate_advance(cursors, buffer_len, state_batch_indices, pad_slot_id, backend);
  if (backend == Backend::kCuda) {
    no_cuda();
  }
  cpu::replay_advance(p);
}

void replay_reset(const TensorView& cursors, const TensorView& slots, int64_t pad_slot_id,
                  const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, cursors.device);
  const CursorParams p = validate_reset(cursors, slots, pad_slot_id, backend);
  if (backend == Backend::kCuda) {
    no_cuda();
  }
  cpu::replay_reset(p);
}

}  // namespace replayssm
