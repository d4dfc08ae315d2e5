"""The pooling, softmax/cross-entropy, CTC, batchnorm, direct-conv and layout builds must stay
spill-free: `python -m gpuk.kernels.build --check` only fails a spilling variant when it
is registered with may_spill=False, so this guards the registration itself."""
from pathlib import Path

import pytest

from gpuk.kernels import runtime

SPILL_FREE_SOURCES = ('pooling.cu', 'softmax_xent.cu', 'ctc.cu', 'ctc_decode.cu', 'ctc_check.cu', 'batchnorm.cu',
                      'conv_depthwise.cu', 'conv_local.cu', 'layout.cu')


@pytest.mark.parametrize('source', SPILL_FREE_SOURCES)
def test_every_variant_is_registered_without_may_spill(source):
    specs = [s for s in runtime.registered_builds() if Path(s.source_file).name == source]
    assert specs, 'no registered build of %s' % source
    allowed = [dict(s.defines).get('ELEMENT_T') for s in specs if s.may_spill]
    assert allowed == [], '%s variants registered with may_spill=True: %s' % (source, allowed)

