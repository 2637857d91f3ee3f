"""The OOD report card (:mod:`report_card.card`) and its page (:mod:`report_card.page`)."""
