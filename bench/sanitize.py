"""The `gpu` kernel tests that compute-sanitizer runs (bench/gpu_session.sh, part `sanitizer`).

    compute-sanitizer --tool memcheck python3 -m bench.sanitize [PYTEST ARGS...]
    python -m bench.sanitize --list            # the node ids, one per line

Sanitizers slow every kernel 10-100x, so the session runs a small subset of tests/kernels:
TESTS names, for every kernel source in gpuk/kernels/, a few `gpu` tests on small shapes that
launch its kernels on CUDA (float32, one 16-bit or tf32 tensor-core path where the source has
one, both data formats where the launcher transposes). tests/bench/test_gpu_session.py checks
in CI that every .cu file has its entry and that every node id still collects, so the list
cannot rot when a test is renamed or its parameters change.

Run as a module it turns CuPy's memory pool off before pytest starts (every array is its own
cudaMalloc, freed when the array goes): inside a pooled chunk an out-of-bounds access lands
in another array's memory and memcheck cannot see it. Pytest then runs the `gpu` tests of
TESTS (``-m gpu``: only their 'cuda' cases) with any further arguments.
"""
import sys

# kernel source (under gpuk/kernels/) -> the tests/kernels node ids that launch its kernels on CUDA
TESTS = {
    'elementwise.cu': (
        'tests/kernels/test_elementwise.py::test_bias_act_fwd_matches_twin[cuda-relu-shape4-1-float32]',
        'tests/kernels/test_elementwise.py::test_copy_is_exact[cuda-4103]',
    ),
    'fused_elementwise.cu': (
        'tests/kernels/test_fused_elementwise.py::test_chain_of_every_expression[cuda-float32]',
        'tests/kernels/test_fused_elementwise.py::test_lstm_cell_kernel_matches_twin[cuda]',
    ),
    'conv/conv_igemm.cu': (
        'tests/kernels/test_conv.py::test_conv_fwd_dgrad_wgrad_match_twin[cuda-2d-5x5-k3x3-s1x1-float32-channels_last]',
        'tests/kernels/test_conv.py::test_conv_fwd_dgrad_wgrad_match_twin[cuda-2d-7x6-k3x2-s2x1-bfloat16-channels_last]',
        'tests/kernels/test_conv.py::test_every_tile_and_split_k[cuda-aligned-channels-3-float32-tf32-64x64x32]',
    ),
    'conv/conv_wgmma.cu': (   # skips on a device other than sm_90
        'tests/kernels/test_wgmma.py::test_launchers_choose_wgmma_on_sm90_devices[cuda]',
    ),
    'conv/conv_depthwise.cu': (
        'tests/kernels/test_conv.py::test_depthwise_matches_twin[cuda-2d-9x8-k3x3-s2x2-float32-channels_last]',
        'tests/kernels/test_conv.py::test_depthwise_matches_twin[cuda-2d-6x7-k3x3-s1x1-float32-channels_first]',
    ),
    'conv/conv_local.cu': (
        'tests/kernels/test_conv.py::test_local_conv_matches_twin[cuda-2d-1-float32-channels_last]',
    ),
    'layout.cu': (
        'tests/kernels/test_layout.py::test_transpose_both_ways_equals_moveaxis[cuda-2x16x8x9-float32]',
    ),
    'pooling.cu': (
        'tests/kernels/test_pooling.py::test_max_pool_matches_twin[cuda-2d-odd-pad-float32-channels_last]',
        'tests/kernels/test_pooling.py::test_avg_pool_matches_twin[cuda-2d-odd-pad-float32-channels_first]',
        'tests/kernels/test_pooling.py::test_global_avg_pool_reduction[cuda-3-spatial0-37-float32-channels_last]',
    ),
    'batchnorm.cu': (
        'tests/kernels/test_batchnorm.py::test_bn_train_fwd_and_bwd_match_twin[cuda-nhwc-float32]',
        'tests/kernels/test_batchnorm.py::test_bn_infer_fwd_matches_twin[cuda-shape1-1-param_shape1-float32]',
        'tests/kernels/test_batchnorm.py::test_fused_train_relu_moving_and_relu_bwd_match_twin[cuda-nchw-n1-float16]',
    ),
    'softmax_xent.cu': (
        'tests/kernels/test_softmax_xent.py::test_softmax_xent_matches_twin[cuda-1030-float32]',
        'tests/kernels/test_softmax_xent.py::test_softmax_family_matches_twin[cuda-33-float32]',
        'tests/kernels/test_softmax_xent.py::test_short_rows_share_a_warp[cuda-12-float32]',
    ),
    'ctc.cu': (
        'tests/kernels/test_ctc.py::test_ctc_loss_and_grad_match_twin[cuda-False-float32]',
        'tests/kernels/test_ctc.py::test_ctc_labels_past_the_shared_memory_states[cuda-float32]',
    ),
    'ctc_check.cu': (
        'tests/kernels/test_ctc.py::test_check_loss_values_matches_twin[cuda-int32-float32]',
    ),
    'ctc_decode.cu': (
        'tests/kernels/test_ctc.py::test_greedy_decode_matches_twin[cuda-True-0-True-float32]',
        'tests/kernels/test_ctc.py::test_beam_search_matches_twin[cuda-4-3-None-False-float32]',
    ),
}


def node_ids():
    """Every node id of TESTS, in order, once."""
    return list(dict.fromkeys(node for nodes in TESTS.values() for node in nodes))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ['--list']:
        print('\n'.join(node_ids()))
        return 0
    import pytest
    from tests import gpu_rehearsal
    gpu_rehearsal.activate_if_requested()   # GPUK_GPU_REHEARSAL=1: the CuPy stand-in, before the import below
    import cupy
    cupy.cuda.set_allocator(None)   # no pool: each array its own allocation, bounds memcheck can see
    return int(pytest.main(['-m', 'gpu', '-v', '-rfEs', '-p', 'no:cacheprovider'] + argv + node_ids()))


if __name__ == '__main__':
    sys.exit(main())
