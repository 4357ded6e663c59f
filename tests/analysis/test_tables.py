"""Report tables (analysis.tables): a section without rows is left out, with one line saying why."""
import pandas as pd

from stallfree.analysis import tables


def test_an_empty_section_is_one_line_saying_why():
    [line] = tables.section("Scheduling ablation", pd.DataFrame(columns=["policy"]), why_empty="no ablation runs here",
                            intro="Hybrid batching only ...")
    assert line.data == "*Scheduling ablation: left out, no ablation runs here.*"


def test_a_section_with_rows_has_its_heading_intro_and_table():
    heading, table = tables.section("Pipeline bubbles", pd.DataFrame({"policy": ["sarathi"], "bubble": [None]}),
                                    why_empty="none", intro="The share of idle stage time.")
    assert heading.data == "## Pipeline bubbles\n\nThe share of idle stage time."
    assert "<td>sarathi</td>" in table.data and f"<td>{tables.MISSING}</td>" in table.data
