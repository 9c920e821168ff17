"""CUDA graphs around Kiln's compiled graphs: kiln.backend(cudagraphs=True),
or ``torch.compile(model, backend="kiln", mode="reduce-overhead")``.

Each forward and backward graph that AOTAutograd hands Kiln is compiled
as always (partitions run by Kiln, the rest eagerly), then wrapped by
PyTorch's CUDA graph trees (torch._inductor.cudagraph_trees, what
``mode="reduce-overhead"`` uses for Inductor and the ``cudagraphs``
backend for aot_eager): the first calls run it directly (warm-up: Kiln
loads its modules and times its GEMM and convolution algorithms there),
then one call is captured and later calls replay it, so a step costs one
graph launch per graph instead of Python and a driver call per partition
and per eager op. Inputs that change between calls are copied into the
graph's static buffers; parameters and buffers are read in place.

What is captured is Kiln's runtime as it runs uncaptured: launches,
cuBLASLt and cuDNN calls on PyTorch's current stream, memory from
PyTorch's caching allocator (the graph's private pool), random numbers
from a seed drawn on the device by PyTorch's generator (so each replay
draws new ones). An index out of range in a replayed graph is not
reported (the check runs when Kiln's runtime is called, which a replay
skips).

This module reuses torch/_dynamo/backends/cudagraphs.py's checks (the
same in torch 2.6 to 2.15): a graph with CPU tensors, ops CUDA graphs
cannot hold, or mutated inputs runs without a CUDA graph (PyTorch logs
why), and so does its backward. So does a graph with symbolic sizes
(dynamic=True, or Dynamo's automatic dynamic shapes after a size
changed): not yet (replays on the H200 were handed inputs of another
size). cudagraph_aot() returns None where this
torch lacks those pieces; the backend then warns once and runs without.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Set

import torch
import torch.fx

__all__ = ["cudagraph_aot"]

Compiler = Callable[[torch.fx.GraphModule, List[Any]], Callable[..., Any]]


def cudagraph_aot(compile_graph: Compiler, compile_captured: Compiler,
                  num_dynamo_inputs: int, **aot_kwargs: Any) -> Optional[Any]:
    """An AOTAutograd backend (aot_autograd with `aot_kwargs`) whose
    forward, backward and inference graphs are replayed as CUDA graphs,
    compiled by `compile_captured` (KilnBackend._compile_graph with
    outputs PyTorch's allocator owns); a graph the trees skip is compiled
    by `compile_graph` (the usual call path). None when this torch lacks
    CUDA graph trees."""
    try:
        from torch._dynamo.backends.common import aot_autograd  # noqa: PLC0415
        from torch._dynamo.backends.cudagraphs import (  # noqa: PLC0415
            check_for_skip, find_input_mutations, get_device_index,
            get_stack_traces)
        from torch._inductor import cudagraph_trees  # noqa: PLC0415
        from torch._inductor.cudagraph_utils import (  # noqa: PLC0415
            BoxedDeviceIndex, get_placeholder_info,
            log_cudagraph_skip_and_bump_counter)
        from torch._inductor.utils import (  # noqa: PLC0415
            BoxedBool, count_tangents, num_fw_fixed_arguments)
    except ImportError:
        return None

    do_cudagraphs = BoxedBool(True)
    device_index = BoxedDeviceIndex(None)

    def skip_reason(gm: torch.fx.GraphModule, static: List[int],
                    mutated: Set[int]) -> Optional[str]:
        """Why gm cannot be a CUDA graph, or None: torch's checks (CPU
        tensors, several devices, ops graphs cannot hold), and inputs it
        mutates that are not static (parameters and buffers are: a batch
        norm's running statistics are written in place on replay)."""
        for node in gm.graph.find_nodes(op="placeholder"):
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt) or (
                    isinstance(val, torch.Tensor) and
                    any(isinstance(d, torch.SymInt) for d in val.shape)):
                # Not yet: replays of one size were handed another's
                # inputs on the H200 (the trees key their recordings by
                # the int inputs; Kiln's graphs did not match that).
                return "symbolic sizes (Kiln records static graphs only)"
        unmanaged = mutated - set(static)
        if unmanaged and not getattr(torch._dynamo.config,
                                     "cudagraph_backend_support_input_mutation",
                                     False):
            return f"mutated inputs {sorted(unmanaged)}"
        return check_for_skip(gm, len(gm.graph.find_nodes(op="placeholder")))

    def wrap(gm: torch.fx.GraphModule, inputs: List[Any], static: List[int],
             mutated: Set[int], is_backward: bool, is_inference: bool) -> Any:
        # What the wrapper needs from the graph as traced: Kiln's
        # compile partitions gm in place.
        index = get_device_index(gm)
        traces = get_stack_traces(gm)
        placeholders = get_placeholder_info(gm.graph)
        compiled = compile_captured(gm, inputs)
        if not is_backward:
            device_index.set(index)

        def run(args: List[Any]) -> Any:
            # The trees' boxed convention: the callee takes the inputs
            # (empties the list), as an FX Interpreter's boxed_run does.
            mine = list(args)
            args.clear()
            return compiled(mine)

        out = cudagraph_trees.cudagraphify_impl(
            run, inputs, static, device_index=index,
            is_backward=is_backward, is_inference=is_inference,
            stack_traces=traces, placeholders=placeholders,
            mutated_input_idxs=mutated)
        out._boxed_call = True
        return out

    def forward(gm: torch.fx.GraphModule, inputs: List[Any],
                is_inference: bool = False) -> Any:
        # Static inputs (read in place, never copied into the graph's
        # buffers): the parameters and buffers, as Inductor takes them
        # (AOTAutograd's static_input_indices; Dynamo inlines modules, so
        # they are graph inputs like any other), else the lifted ones.
        context = torch._guards.TracingContext.try_get()
        meta = getattr(context, "fw_metadata", None)
        static = getattr(meta, "static_input_indices", None)
        if static is None:
            static = range(num_fw_fixed_arguments(num_dynamo_inputs,
                                                  len(inputs)))
        static = list(static)
        mutated = find_input_mutations(gm.graph)
        skip = skip_reason(gm, static, mutated)
        if skip:
            BoxedBool.disable(do_cudagraphs)
            log_cudagraph_skip_and_bump_counter(
                f"skipping cudagraphs due to {skip}")
            return compile_graph(gm, inputs)
        return wrap(gm, inputs, static, mutated, False, is_inference)

    def backward(gm: torch.fx.GraphModule, inputs: List[Any]) -> Any:
        if not do_cudagraphs:
            return compile_graph(gm, inputs)
        # The saved values are the forward graph's outputs (its pool's
        # memory): static; the tangents are copied in.
        static = list(range(count_tangents(gm)))
        mutated = find_input_mutations(gm.graph)
        skip = skip_reason(gm, static, mutated)
        if not skip:
            return wrap(gm, inputs, static, mutated, True, False)
        log_cudagraph_skip_and_bump_counter(
            f"skipping cudagraphs due to {skip}")
        # The forward was captured: the tree must know its backward runs
        # (torch's cudagraphs backend does the same).
        compiled = compile_graph(gm, inputs)
        manager = cudagraph_trees.get_manager(
            device_index.value if device_index.value is not None else 0,
            create_if_none_exists=False)

        def run(args: List[Any]) -> Any:
            if manager is not None:
                manager.set_to_running_backward()
            return compiled(args)

        run._boxed_call = True
        return run

    return aot_autograd(fw_compiler=forward, bw_compiler=backward,
                        inference_compiler=functools.partial(
                            forward, is_inference=True),
                        **aot_kwargs)
