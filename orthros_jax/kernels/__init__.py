"""Array-only math, no parameters: attention (sliding window, global, few-query, the one mask
rule), the delta rule, cache slot reads/writes, sequence-parallel collectives."""
