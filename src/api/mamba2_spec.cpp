// The speculative entry points: validate, then hand the flattened call to the chosen backend.
#include "replayssm/mamba2_spec.hpp"

#include <string>

#include "api/validate.hpp"
#include "api/validate_spec.hpp"
#include "cpu/mamba2_spec_cpu.hpp"
#include "reference/mamba2_reference.hpp"
#if defined(REPLAYSSM_WITH_CUDA)
#include "cuda/mamba2_spec_cuda.hpp"
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
void spec_verify(const SpecVerifyParams&, void*) { unavailable(); }
void spec_state_update(const SpecBaselineParams&, void*) { unavailable(); }
void spec_commit(const SpecRingParams&, void*) { unavailable(); }
void spec_reset(const SpecRingParams&, void*) { unavailable(); }
}  // namespace device
#endif

}  // namespace

void spec_verify(const SpecCache& cache, const Mamba2Window& window, int64_t buffer_len,
                 const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, cache.state.device);
  const SpecVerifyParams p = validate_spec_verify(cache, window, buffer_len, backend, options);
  switch (backend) {
    case Backend::kReference: return reference::spec_verify(p);
    case Backend::kCuda: return device::spec_verify(p, options.cuda_stream);
    default: return cpu::spec_verify(p);
  }
}

int64_t spec_verify_workspace_bytes(int64_t batch, int64_t window, int64_t nheads, int64_t head_dim) {
  if (batch < 0 || window < 0 || nheads < 0 || head_dim < 0)
    throw InvalidArgument("replayssm: spec_verify_workspace_bytes(batch=" + std::to_string(batch) +
                          ", window=" + std::to_string(window) + ", nheads=" + std::to_string(nheads) +
                          ", head_dim=" + std::to_string(head_dim) + "): sizes must not be negative");
  return 4 * spec_workspace_floats(batch, window, nheads, head_dim);
}

void spec_state_update(const TensorView& state, const Mamba2Window& window,
                       const TensorView& num_accepted_tokens, const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, state.device);
  const SpecBaselineParams p = validate_spec_state_update(state, window, num_accepted_tokens, backend);
  switch (backend) {
    case Backend::kReference: return reference::spec_state_update(p);
    case Backend::kCuda: return device::spec_state_update(p, options.cuda_stream);
    default: return cpu::spec_state_update(p);
  }
}

void spec_commit(const TensorView& ring, const TensorView& num_accepted_tokens, int64_t window,
                 int64_t buffer_len, const TensorView& state_batch_indices, int64_t pad_slot_id,
                 const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, ring.device);
  const SpecRingParams p = validate_spec_commit(ring, num_accepted_tokens, window, buffer_len,
                                                state_batch_indices, pad_slot_id, backend);
  if (backend == Backend::kCuda) return device::spec_commit(p, options.cuda_stream);
  cpu::spec_commit(p);
}

void spec_reset(const TensorView& ring, const TensorView& slots, int64_t pad_slot_id,
                const ExecOptions& options) {
  const Backend backend = resolve_backend(options.backend, ring.device);
  const SpecRingParams p = validate_spec_reset(ring, slots, pad_slot_id, backend);
  if (backend == Backend::kCuda) return device::spec_reset(p, options.cuda_stream);
  cpu::spec_reset(p);
}

}  // namespace replayssm
