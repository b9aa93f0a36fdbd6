// The extension module replayssm._replayssm: every public entry point of the C++ API, taking
// Python arrays (DLPack) and a raw stream. The Python package wraps these with mamba-ssm's
// signatures, defaults and the choice of stream; this layer only imports and forwards.
#include <cstdint>
#include <string>

#include <nanobind/nanobind.h>

#include "dlpack_import.hpp"
#include "replayssm/mamba2.hpp"
#include "replayssm/runtime.hpp"

namespace nb = nanobind;

namespace replayssm::python {
namespace {

ExecOptions exec_options(uintptr_t stream, int backend) {
  if (backend < int(Backend::kAuto) || backend > int(Backend::kCuda))
    throw InvalidArgument("replayssm: backend=" + std::to_string(backend) +
                          " is not a Backend value");
  ExecOptions options;
  options.backend = Backend(backend);
  options.cuda_stream = reinterpret_cast<void*>(stream);
  return options;
}

WindowKernel window_kernel_choice(int choice) {
  if (choice < int(WindowKernel::kAuto) || choice > int(WindowKernel::kSeparate))
    throw InvalidArgument("replayssm: window_kernel=" + std::to_string(choice) +
                          " is not a WindowKernel value");
  return WindowKernel(choice);
}

ReplayRoute replay_route(int route) {
  if (route < int(ReplayRoute::kAuto) || route > int(ReplayRoute::kStateAndOutput))
    throw InvalidArgument("replayssm: route=" + std::to_string(route) +
                          " is not a ReplayRoute value");
  return ReplayRoute(route);
}

// The per-step arguments, in mamba-ssm's order.
struct StepArrays {
  nb::handle x, dt, A, B, C, D, z, dt_bias;
  bool dt_softplus;
  nb::handle state_batch_indices;
  int64_t pad_slot_id;
  nb::handle out;
};

Mamba2Step import_step(ImportedTensors& tensors, const StepArrays& a) {
  Mamba2Step step;
  step.x = tensors.view(a.x, "x", Access::kRead);
  step.dt = tensors.view(a.dt, "dt", Access::kRead);
  step.A = tensors.view(a.A, "A", Access::kRead);
  step.B = tensors.view(a.B, "B", Access::kRead);
  step.C = tensors.view(a.C, "C", Access::kRead);
  step.D = tensors.view(a.D, "D", Access::kRead);
  step.z = tensors.view(a.z, "z", Access::kRead);
  step.dt_bias = tensors.view(a.dt_bias, "dt_bias", Access::kRead);
  step.dt_softplus = a.dt_softplus;
  step.state_batch_indices =
      tensors.view(a.state_batch_indices, "state_batch_indices", Access::kRead);
  step.pad_slot_id = a.pad_slot_id;
  step.out = tensors.view(a.out, "out", Access::kWrite);
  return step;
}

void selective_state_update(nb::handle state, nb::handle x, nb::handle dt, nb::handle A,
                            nb::handle B, nb::handle C, nb::handle D, nb::handle z,
                            nb::handle dt_bias, bool dt_softplus, nb::handle state_batch_indices,
                            int64_t pad_slot_id, nb::handle out, uintptr_t stream,
                            bool torch_export_direct, int backend) {
  const ExecOptions options = exec_options(stream, backend);
  ImportedTensors tensors({stream, torch_export_direct});
  const TensorView state_view = tensors.view(state, "state", Access::kWrite);
  const Mamba2Step step = import_step(
      tensors, {x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out});
  nb::gil_scoped_release unlocked;
  replayssm::selective_state_update(state_view, step, options);
}

void replay_decode(nb::handle state, nb::handle x_cache, nb::handle B_cache, nb::handle dt_cache,
                   nb::handle cursors, nb::handle x, nb::handle dt, nb::handle A, nb::handle B,
                   nb::handle C, nb::handle D, nb::handle z, nb::handle dt_bias, bool dt_softplus,
                   nb::handle state_batch_indices, int64_t pad_slot_id, nb::handle out, int route,
                   nb::handle workspace, int window_kernel, uintptr_t stream,
                   bool torch_export_direct, int backend) {
  ExecOptions options = exec_options(stream, backend);
  options.window_kernel = window_kernel_choice(window_kernel);
  const ReplayRoute replay_route_value = replay_route(route);
  ImportedTensors tensors({stream, torch_export_direct});
  options.workspace = tensors.view(workspace, "workspace", Access::kScratch);
  ReplayCache cache;
  cache.state = tensors.view(state, "state", Access::kWrite);
  cache.x_cache = tensors.view(x_cache, "x_cache", Access::kWrite);
  cache.B_cache = tensors.view(B_cache, "B_cache", Access::kWrite);
  cache.dt_cache = tensors.view(dt_cache, "dt_cache", Access::kWrite);
  cache.cursors = tensors.view(cursors, "cursors", Access::kRead);
  const Mamba2Step step = import_step(
      tensors, {x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out});
  nb::gil_scoped_release unlocked;
  replayssm::replay_decode(cache, step, replay_route_value, options);
}

void replay_advance(nb::handle cursors, int64_t buffer_len, nb::handle state_batch_indices,
                    int64_t pad_slot_id, uintptr_t stream, bool torch_export_direct, int backend) {
  const ExecOptions options = exec_options(stream, backend);
  ImportedTensors tensors({stream, torch_export_direct});
  const TensorView cursors_view = tensors.view(cursors, "cursors", Access::kWrite);
  const TensorView indices_view =
      tensors.view(state_batch_indices, "state_batch_indices", Access::kRead);
  nb::gil_scoped_release unlocked;
  replayssm::replay_advance(cursors_view, buffer_len, indices_view, pad_slot_id, options);
}

void replay_reset(nb::handle cursors, nb::handle slots, int64_t pad_slot_id, uintptr_t stream,
                  bool torch_export_direct, int backend) {
  const ExecOptions options = exec_options(stream, backend);
  ImportedTensors tensors({stream, torch_export_direct});
  const TensorView cursors_view = tensors.view(cursors, "cursors", Access::kWrite);
  const TensorView slots_view = tensors.view(slots, "slots", Access::kRead);
  nb::gil_scoped_release unlocked;
  replayssm::replay_reset(cursors_view, slots_view, pad_slot_id, options);
}

}  // namespace
}  // namespace replayssm::python

NB_MODULE(_replayssm, m) {
  using namespace replayssm::python;
  using namespace nb::literals;
  m.doc() = "replayssm's C++ entry points on DLPack arrays; use the replayssm package instead.";

  nb::exception<replayssm::InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);
  nb::exception<replayssm::CudaError>(m, "CudaError", PyExc_RuntimeError);

  // Every array argument accepts None: optional ones mean "absent", required ones are then
  // refused by the library's validation with the argument's name.
  m.def("selective_state_update", &selective_state_update, "state"_a.none(), "x"_a.none(),
        "dt"_a.none(), "A"_a.none(), "B"_a.none(), "C"_a.none(), "D"_a.none(), "z"_a.none(),
        "dt_bias"_a.none(), "dt_softplus"_a, "state_batch_indices"_a.none(), "pad_slot_id"_a,
        "out"_a.none(), "stream"_a, "torch_export_direct"_a, "backend"_a);
  m.def("replay_decode", &replay_decode, "state"_a.none(), "x_cache"_a.none(),
        "B_cache"_a.none(), "dt_cache"_a.none(), "cursors"_a.none(), "x"_a.none(),
        "dt"_a.none(), "A"_a.none(), "B"_a.none(), "C"_a.none(), "D"_a.none(), "z"_a.none(),
        "dt_bias"_a.none(), "dt_softplus"_a, "state_batch_indices"_a.none(), "pad_slot_id"_a,
        "out"_a.none(), "route"_a, "workspace"_a.none(), "window_kernel"_a, "stream"_a,
        "torch_export_direct"_a, "backend"_a);
  m.def("replay_decode_workspace_bytes", &replayssm::replay_decode_workspace_bytes, "batch"_a,
        "nheads"_a, "head_dim"_a);
  m.def("replay_advance", &replay_advance, "cursors"_a.none(), "buffer_len"_a,
        "state_batch_indices"_a.none(), "pad_slot_id"_a, "stream"_a, "torch_export_direct"_a,
        "backend"_a);
  m.def("replay_reset", &replay_reset, "cursors"_a.none(), "slots"_a.none(), "pad_slot_id"_a,
        "stream"_a, "torch_export_direct"_a, "backend"_a);
  m.def("register_torch", &register_torch);
  m.def("built_with_cuda", &replayssm::built_with_cuda);
  m.def("cuda_device_count", &replayssm::cuda_device_count);
}
