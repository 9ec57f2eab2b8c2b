"""What a sweep stores, typed: variant.py (``VariantSetup``, ``VariantRecord``), claim.py
(``Claim``), results_file.py (results.json), correctness.py (``DIR/correct/``), loss_rows.py
(``DIR/lm_loss/``) and formatting.py (how every report prints a number)."""
