"""Byte sizes: format_bytes for people, parse_size strictly back."""
from __future__ import annotations

import pytest

from gpumemdoctor.units import format_bytes, format_duration, full_words, parse_size

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("n, text", [
    (None, "n/a"),
    (0, "0 B"),
    (1, "1 B"),
    (1023, "1023 B"),
    (KiB, "1.00 KiB"),
    (1536, "1.50 KiB"),
    (10 * KiB, "10.0 KiB"),
    (MiB, "1.00 MiB"),
    (int(9.5 * MiB), "9.50 MiB"),
    (99 * MiB, "99.0 MiB"),
    (100 * MiB, "100 MiB"),
    (1536 * MiB, "1.50 GiB"),
    (80 * GiB, "80.0 GiB"),
    (512 * GiB, "512 GiB"),
    (2 * TiB, "2048 GiB"),  # GiB is the largest unit shown
    (-MiB, "-1.00 MiB"),
    (-5, "-5 B"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("n, text", [
    (0, "0 B"),
    (3 * MiB, "+3.00 MiB"),
    (-3 * MiB, "-3.00 MiB"),
    (None, "n/a"),
])
def test_format_bytes_signed(n, text):
    assert format_bytes(n, signed=True) == text


def test_format_bytes_unsigned_has_no_plus():
    assert format_bytes(3 * MiB) == "3.00 MiB"


@pytest.mark.parametrize("text, n", [
    ("0", 0),
    ("100", 100),
    ("100b", 100),
    ("100B", 100),
    ("512MiB", 512 * MiB),
    ("512 MiB", 512 * MiB),
    ("  2GiB  ", 2 * GiB),
    ("1.5GiB", int(1.5 * GiB)),
    ("1k", KiB),
    ("1K", KiB),
    ("1kib", KiB),
    ("1kb", 1000),
    ("1KB", 1000),
    ("3 MB", 3_000_000),
    ("3m", 3 * MiB),
    ("2g", 2 * GiB),
    ("1gb", 10**9),
    ("1T", TiB),
    ("1TiB", TiB),
    ("1tb", 10**12),
    ("1PiB", 1 << 50),  # issue 41, cause 4: the documented limit, 1 EiB, is itself a size
    ("2p", 2 << 50),
    ("1pb", 10**15),
    ("1EiB", 1 << 60),
    ("1 eib", 1 << 60),
    ("1EB", 10**18),
    ("0.5EiB", 1 << 59),
])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", [
    "", "   ", "MiB", "abc", "-1MiB", "+1MiB", "1.5.2GiB", "1,5GiB", "1e3", "1e", "1 ZiB", "1 MiBs",
    "1 M iB", "0x10", "1GiB 2MiB", "nan", "inf",
])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message
    assert "512MiB" in message  # says how to write one


@pytest.mark.parametrize("text", ["1.5EiB", "1025PiB", "2EB"])
def test_parse_size_refuses_more_than_an_exbibyte(text):
    with pytest.raises(ValueError, match="larger than any memory"):
        parse_size(text)


@pytest.mark.parametrize("n", [0, 1, 1023, KiB, 1536, MiB, 3 * MiB, 1536 * MiB, 2 * GiB, 512 * GiB])
def test_what_format_bytes_writes_parse_size_reads_back(n):
    assert parse_size(format_bytes(n)) == n


@pytest.mark.parametrize("seconds, text", [
    (0.2, "under a second"),
    (1, "about 1 second"),
    (1.4, "about 1 second"),
    (44.6, "about 45 seconds"),
    (89, "about 89 seconds"),
    (90, "about 2 minutes"),  # 1.5 minutes, rounded half up
    (720, "about 12 minutes"),
    (89 * 60, "about 89 minutes"),
    (90 * 60, "about 2 hours"),
    (5 * 3600 + 1000, "about 5 hours"),
    (47 * 3600, "about 47 hours"),
    (48 * 3600, "about 2 days"),
    (3.4 * 86400, "about 3 days"),
    (364 * 86400, "about 364 days"),
    (365 * 86400, "more than a year"),
    (1e30, "more than a year"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_full_words_now_and_for_a_run_that_ended():
    assert full_words(35 * MiB, 720) == "at 35.0 MiB/s the GPU is full in about 12 minutes"
    assert full_words(35 * MiB, 720, gpu="GPU 1") == "at 35.0 MiB/s GPU 1 is full in about 12 minutes"
    assert full_words(35 * MiB, 720, ended=True) == "at 35.0 MiB/s it would have been full in about 12 minutes"
    assert full_words(2 * GiB, 0.4) == "at 2.00 GiB/s the GPU is full in under a second"


def test_full_words_of_a_full_gpu():
    assert full_words(MiB, 0) == "at 1.00 MiB/s the GPU is already full"
    assert full_words(MiB, 0, gpu="GPU 0", ended=True) == "at 1.00 MiB/s GPU 0 was already full"
