

def test_absurd_numbers_are_one_line_not_a_crash():
    import pytest

    from kvplan.errors import InputError
    from kvplan.units import MAX_COUNT, parse_bytes, parse_count, parse_tokens

    assert parse_tokens(str(MAX_COUNT)) == MAX_COUNT
    for bad in (str(MAX_COUNT + 1), "1" + "0" * 30, "9" * 5000):
        with pytest.raises(InputError, match="too large"):
            parse_tokens(bad, "--ctx")
        with pytest.raises(InputError, match="too large"):
            parse_count(bad, "--batch")
    with pytest.raises(InputError, match="too large"):
        parse_bytes("9" * 5000 + "GB", "--kv-budget")
    with pytest.raises(InputError, match="too large"):
        parse_bytes(str(1 << 61), "--kv-budget")
