// The public entry points: validate, then hand the flattened call to the chosen backend.
#include "replayssm/mamba2.hpp"

#include <string>

#include "api/validate.hpp"
#include "cpu/mamba2_cpu.hpp"
#include "reference/mamba2_reference.hpp"
#if defined(REPLAYSSM_WITH_CUDA)
#include "cuda/mamba2_cuda.hpp"
#endif

namespace replayssm {
namespace {

// resolve_backend() refuses Backend::kCuda in a build without CUDA, so these never run there.
#if defined(REPLAYSSM_WITH_CUDA)
namespace device = cuda;
#else
namespace device {
[[noreturn]] void unavailable() {
  throw InvalidArgument("replayssm: the CUDA backend has no kernels in this build");
}
void selective_state_update(const Mamba2Params&, void*) { unavailable(); }
void replay_decode(const ReplayParams&, void*) { unavailable(); }
void replay_advance(const CursorParams&, void*) { unavailable(); }
void replay_reset(const CursorParams&, void*) { unavailable(); }
}  // namespace device
#endif

}  // namespace

void selective_state_update(const TensorView& state, const Mamba2Step& step,
                            const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, state.device);
  const Mamba2Params p = validate_state_update(state, step, backend);
  switch (backend) {
    case Backend::kReference: return reference::selective_state_update(p);
    case Backend::kCuda: return device::selective_state_update(p, options.cuda_stream);
    default: return cpu::selective_state_update(p);
  }
}

void replay_decode(const ReplayCache& cache, const Mamba2Step& step, ReplayRoute route,
                   const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, cache.state.device);
  ReplayParams p = validate_replay_decode(cache, step, route, backend, options.workspace);
  p.window_kernel = options.window_kernel;
  switch (backend) {
    case Backend::kReference: return reference::replay_decode(p);
    case Backend::kCuda: return device::replay_decode(p, options.cuda_stream);
    default: return cpu::replay_decode(p);
  }
}

int64_t replay_decode_workspace_bytes(int64_t batch, int64_t nheads, int64_t head_dim) {
  if (batch < 0 || nheads < 0 || head_dim < 0)
    throw InvalidArgument("replayssm: replay_decode_workspace_bytes(batch=" + std::to_string(batch) +
                          ", nheads=" + std::to_string(nheads) + ", head_dim=" +
                          std::to_string(head_dim) + "): sizes must not be negative");
  return 4 * replay_workspace_floats(batch, nheads, head_dim);
}

void replay_advance(const TensorView& cursors, int64_t buffer_len,
                    const TensorView& state_batch_indices, int64_t pad_slot_id,
                    const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, cursors.device);
  const CursorParams p =
      validate_advance(cursors, buffer_len, state_batch_indices, pad_slot_id, backend);
  if (backend == Backend::kCuda) return device::replay_advance(p, options.cuda_stream);
  cpu::replay_advance(p);
}

void replay_reset(const TensorView& cursors, const TensorView& slots, int64_t pad_slot_id,
                  const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, cursors.device);
  const CursorParams p = validate_reset(cursors, slots, pad_slot_id, backend);
  if (backend == Backend::kCuda) return device::replay_reset(p, options.cuda_stream);
  cpu::replay_reset(p);
}

}  // namespace replayssm
