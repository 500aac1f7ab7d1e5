"""Text <-> tokens: tokenizer, chat template, incremental detokenizing, stop strings."""
