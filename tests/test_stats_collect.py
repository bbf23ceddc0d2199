"""inspect/stats/collect.py: the metadata columns ``stats --by`` reads from the index (review of issues 14/16)."""

import pytest
from conftest import write_ham

from wds_tools.convert import convert
from wds_tools.errors import OptionError
from wds_tools.inspect.stats import compute_stats


def test_by_the_label_column_says_it_is_the_label(tmp_path):
    manifest = write_ham(tmp_path / "ham", [2, 1, 3, 1])
    convert(
        manifest,
        version="v1",
        size=8,
        out=tmp_path / "out",
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        workers=1,
        progress=False,
    )
    with pytest.raises(OptionError) as e:
        compute_stats(tmp_path / "out" / "v1" / "8", by="dx")
    message = str(e.value)
    assert "'dx' Its" not in message and "label" in message, message
