"""The OOD report card: :mod:`report_card.card` (ReportCard: its configuration and a loop over the registered
methods), :mod:`report_card.leaderboard` (the comparisons, the seed means), :mod:`report_card.provenance`
(versions, files, data, the stale mark), :mod:`report_card.publish` (W&B) and :mod:`report_card.page` (the HTML
and Markdown page)."""
