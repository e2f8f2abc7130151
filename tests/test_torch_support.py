import pytest

from tutorial_utils.measurement.torch_support import require_tested_torch, torch_release


def test_versions_are_read_with_their_local_labels():
    assert torch_release("2.9.1+cu128") == (2, 9)
    assert torch_release("2.14.1") == (2, 14)
    assert torch_release("2.10.0a0+git1234") == (2, 10)


def test_an_older_torch_gets_one_line_saying_what_to_install():
    for tested in ("2.9.1", "2.11.0", "2.14.1+cu130", "2.15.0+cu132"):
        require_tested_torch(tested)
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.9 \(found 2\.4\.0\): pip install"):
        require_tested_torch("2.4.0")
