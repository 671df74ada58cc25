"""Cleaning operators: pure functions over a text, a canonical record or a pyarrow.Table (no Ray here).

normalize   Unicode NFC, full-width ASCII letters/digits -> half-width, whitespace cleanup, optional OpenCC t2s
pii         typed redaction of resident IDs, phones, e-mails and bank cards, keeping clinical numbers
signoff     stock closing phrases stripped from the end of responses
quality     per-field length, low-information, repetition and special-character filters, built on
  low_information   filler, deflections, repeated units and low token entropy in responses
  text_measures     character classes, jieba content tokens, entropy, 3-gram repetition, special-char share
dedup       exact and MinHash near-duplicate detection
record      the per-record pipeline (normalize -> sign-offs -> PII -> quality) and its Ray Data batch adapter

Nothing here logs or prints record text; drop reasons are short machine-readable strings.
"""
