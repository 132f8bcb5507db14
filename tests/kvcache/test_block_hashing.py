from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import pytest

from kvcache.hashing import ROOT_PARENT, hash_block, hash_token_blocks, model_fingerprint

FP = model_fingerprint(model="test", block_size=4)


def test_fingerprint_is_canonical_and_separates_models() -> None:
    assert len(FP) == 16
    assert model_fingerprint(block_size=4, model="test") == FP  # key order does not matter
    assert model_fingerprint(model="test", block_size=8) != FP
    assert model_fingerprint(model="test", block_size=4, dtype="bfloat16") != FP


def test_pinned_digests() -> None:
    """A change of the hashing scheme must be noticed: it invalidates every cache-store key."""
    assert FP.hex() == "4a93ec31768fb1c22bc8a62222e327f1"
    assert hash_block(None, [1, 2, 3, 4], FP).hex() == "675aed3ecc020d6a951b1cae0c4467dd"


def test_scheme_is_blake2b_of_parent_fingerprint_le_uint32_tokens() -> None:
    parent = hash_block(None, [9, 9, 9, 9], FP)
    tokens = [0, 1, 70000, 2**32 - 1]
    expected = hashlib.blake2b(
        parent + FP + struct.pack("<4I", *tokens), digest_size=16, person=b"pdserve.block.v1"
    ).digest()
    assert hash_block(parent, tokens, FP) == expected
    assert hash_block(None, tokens, FP) == hash_block(ROOT_PARENT, tokens, FP)


def test_stable_across_processes() -> None:
    code = (
        "from kvcache.hashing import hash_block, model_fingerprint;"
        "print(hash_block(None, [5, 6, 7, 8], model_fingerprint(model='test', block_size=4)).hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == hash_block(None, [5, 6, 7, 8], FP).hex()


def test_chain_same_tokens_different_parent() -> None:
    a = hash_block(None, [1, 2, 3, 4], FP)
    b = hash_block(None, [4, 3, 2, 1], FP)
    assert hash_block(a, [5, 6, 7, 8], FP) != hash_block(b, [5, 6, 7, 8], FP)
    assert hash_block(a, [5, 6, 7, 8], FP) != hash_block(None, [5, 6, 7, 8], FP)


def test_fingerprint_separates_same_tokens() -> None:
    other = model_fingerprint(model="other", block_size=4)
    assert hash_block(None, [1, 2, 3, 4], FP) != hash_block(None, [1, 2, 3, 4], other)


def test_hash_token_blocks_chains_full_blocks_only() -> None:
    tokens = list(range(10))
    keys = hash_token_blocks(tokens, 4, FP)
    assert len(keys) == 2  # tokens 8, 9 form a partial block: no key
    assert keys[0] == hash_block(None, tokens[0:4], FP)
    assert keys[1] == hash_block(keys[0], tokens[4:8], FP)
    assert hash_token_blocks(tokens[:3], 4, FP) == []
    assert hash_token_blocks([], 4, FP) == []
    assert hash_token_blocks(tokens[:8], 4, FP) == keys


def test_hash_token_blocks_continues_from_parent() -> None:
    tokens = list(range(12))
    keys = hash_token_blocks(tokens, 4, FP)
    assert hash_token_blocks(tokens[4:], 4, FP, parent=keys[0]) == keys[1:]


def test_out_of_range_token_rejected() -> None:
    with pytest.raises(struct.error):
        hash_block(None, [-1, 0, 0, 0], FP)
