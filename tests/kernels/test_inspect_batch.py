"""The inspect report's batched disassembly (gpuk/kernels/inspect/elf.py, sass.disassemble_texts):
cubins of one architecture merged into one image, disassembled by one nvdisasm run, and the
listing split back per cubin give the same text (so the same parsed SASS) as one run per cubin.

Four small cubins of tests/kernels/cu/strided_copy.cu (two kernels each, one of them calling
the 64-bit division subroutine): about two seconds of NVRTC, cached per session.
"""
from pathlib import Path

import pytest

from gpuk.kernels import runtime
from gpuk.kernels.runtime import build
from gpuk.kernels.runtime.kernel_source import normalized_defines
from gpuk.kernels.inspect import __main__ as cli
from gpuk.kernels.inspect import elf, sass

COPY_CU = Path(__file__).with_name('cu') / 'strided_copy.cu'


@pytest.fixture(scope='module')
def cubins(sass_tools, tmp_path_factory):
    """Cubin paths: COPY_THREADS 256 and 128 for sm_90, the same for sm_80 (two of each kind)."""
    folder = tmp_path_factory.mktemp('batch-cache')
    paths = []
    for arch in ('sm_90', 'sm_80'):
        for threads in (256, 128):
            spec = runtime.BuildSpec(str(COPY_CU), normalized_defines({'COPY_THREADS': threads}),
                                     ('coalesced_copy', 'strided_copy'))
            result = build.cached_build(spec, arch, folder)
            assert result.error is None, result.error
            paths.append(result.path)
    return paths


def _parsed(text):
    return {name: (f.instructions, f.labels) for name, f in sass.parse(text).items()}


def test_batched_listings_are_the_single_listings(cubins, monkeypatch):
    single = [sass.disassemble_text(path) for path in cubins]
    fallbacks = []
    real = sass.disassemble_text
    monkeypatch.setattr(sass, 'disassemble_text', lambda path: fallbacks.append(path) or real(path))
    batched = sass.disassemble_texts(cubins, processes=1)
    assert fallbacks == []   # both pairs went through one merged image each
    assert batched == single
    assert [_parsed(text) for text in batched] == [_parsed(text) for text in single]
    functions = sass.parse(batched[1])
    assert set(functions) == {'coalesced_copy', 'strided_copy'}
    # the division subroutine's CALL names it as the single listing does (no merge mark left)
    calls = [i.operands for i in functions['strided_copy'].instructions if i.opcode.startswith('CALL')]
    assert calls and not any('gpukb' in operands for operands in calls)
    assert sass.disassemble_texts(cubins, processes=2) == single


def test_merged_image_holds_every_function_of_every_cubin_marked(cubins):
    images = [path.read_bytes() for path in cubins[:2]]
    merged = elf.merge(images)
    assert elf.code_sections(merged) == ['.text.gpukb%d_%s' % (k, name[len('.text.'):])
                                         for k, image in enumerate(images) for name in elf.code_sections(image)]
    with pytest.raises(ValueError, match='another architecture'):
        elf.merge([images[0], cubins[2].read_bytes()])    # sm_90 with sm_80


def test_a_listing_that_does_not_split_falls_back_to_one_run_per_cubin(cubins, monkeypatch):
    """An image nvdisasm reads differently than expected (here: only the first cubin of the
    pair), or cubins elf.merge cannot merge, cost time, never a wrong listing."""
    single = [sass.disassemble_text(path) for path in cubins[:2]]
    monkeypatch.setattr(elf, 'merge', lambda images: images[0])
    assert sass.disassemble_texts(cubins[:2], processes=1) == single

    def unknown_layout(images):
        raise ValueError('elf.merge: cubin 1 has 2 symbol tables, expected 1')
    monkeypatch.setattr(elf, 'merge', unknown_layout)
    assert sass.disassemble_texts(cubins[:2], processes=1) == single
    with pytest.raises(ValueError, match='code sections'):
        sass.split_listing(single[0], [elf.code_sections(path.read_bytes()) for path in cubins[:2]])


def test_canonical_listing_numbers_labels_by_first_appearance():
    text = ('        /*0000*/ @P0 BRA `(.L_x_7) ;\n.L_x_3:\n        /*0010*/ BRX R2 -0x20      '
            '(*"BRANCH_TARGETS .L_x_3,.L_x_7"*);\n.L_x_7:\n')
    assert sass.canonical_listing(text) == ('        /*0000*/ @P0 BRA `(.L_x_0) ;\n.L_x_1:\n        /*0010*/ BRX R2 '
                                            '-0x20 (*"BRANCH_TARGETS .L_x_1,.L_x_0"*);\n.L_x_0:\n')


def test_missing_nvdisasm_is_a_clear_error(cubins, monkeypatch, capsys):
    monkeypatch.setenv('GPUK_NVDISASM', '/nonexistent/nvdisasm')
    with pytest.raises(sass.ToolMissing, match='GPUK_NVDISASM'):
        sass.disassemble_texts(cubins)
    monkeypatch.delenv('GPUK_NVDISASM')
    monkeypatch.setattr(sass.os, 'access', lambda path, mode: False)   # no wheel, toolkit or PATH entry
    monkeypatch.setattr(sass.shutil, 'which', lambda name: None)
    with pytest.raises(sass.ToolMissing, match='pip install nvidia-cuda-nvdisasm'):
        sass.disassemble_texts(cubins)
    assert cli.main(['--no-emulate', '--quiet']) == 2
    assert 'pip install nvidia-cuda-nvdisasm' in capsys.readouterr().err
