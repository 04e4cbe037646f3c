"""Decode a store's entries into Arrow rows: the pinned encoding, keys by their encoder, values.

:class:`StoreEncoding` is what the offset log pins about keys and values (backend, codec, Avro
or UnsafeRow, row checksums, the list-state merge delimiter, checkpoint format). The decoders
take row bytes (after the backend's :class:`~statectl.backends.entries.EntryCodec` envelope)
to struct arrays: plain keys, prefix-scan keys, timestamp keys (join format 4), merged lists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statectl.backends import Backend, EntryCodec, ReadOptions, get_backend
from statectl.backends.entries import binary_parts, read_le_int, slice_bytes
from statectl.checkpoint.model import (
    CODEC_CONF,
    ENCODING_CONF,
    MERGE_OPERATOR_CONF,
    ROW_CHECKSUM_CONF,
    Checkpoint,
    StoreDescription,
)
from statectl.codecs.avro import decode_avro_rows
from statectl.codecs.compression import normalize_codec
from statectl.codecs.sparktypes import parse_schema, to_arrow_schema
from statectl.codecs.unsaferow_decode import decode_unsafe_rows
from statectl.errors import CorruptFileError, StatectlError, UnsupportedError
from statectl.join_state import read_be_times


@dataclass(frozen=True)
class StoreEncoding:
    """How the pinned confs say keys and values are laid out in this checkpoint."""

    backend: str
    codec: str
    avro: bool
    row_checksum: bool
    merge_delimiter: bytes
    checkpoint_format: int

    @classmethod
    def of(cls, ckpt: Checkpoint, batch: int) -> StoreEncoding:
        off = ckpt.offsets(batch)
        return cls(
            backend=ckpt.backend(batch),
            codec=normalize_codec(off.pinned_conf(CODEC_CONF) or "lz4"),
            avro=(off.pinned_conf(ENCODING_CONF) or "unsaferow") == "avro",
            row_checksum=(off.pinned_conf(ROW_CHECKSUM_CONF) or "false") == "true",
            merge_delimiter=b"" if off.pinned_conf(MERGE_OPERATOR_CONF) == "2" else b",",
            checkpoint_format=ckpt.checkpoint_format_version(batch),
        )

    @property
    def store_backend(self) -> Backend:
        return get_backend(self.backend)

    def entry_codec(self, cf_id: int | None = None) -> EntryCodec:
        """The backend's bytes around rows, but the version byte: the row decoders strip it
        (with an Avro schema id after it, or inside prefix-scan keys)."""
        codec = self.store_backend.entry_codec(cf_id=cf_id, row_checksum=self.row_checksum)
        return codec.envelope()

    @property
    def row_prefix(self) -> int:
        """Bytes in front of an encoded row: the version byte, and Avro's int16 schema id."""
        version = self.store_backend.entry_codec().row_prefix
        return version + 2 if self.avro else version

    def read_options(self, unique_id: str | None, verify: bool) -> ReadOptions:
        return ReadOptions(self.codec, unique_id, self.merge_delimiter, verify)


def _struct_fields(schema_json: str) -> list[dict]:
    return json.loads(schema_json)["fields"]


def _sub_schema(fields: list[dict]) -> str:
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def decode_rows(rows: pa.Array, schema_json: str, enc: StoreEncoding, path: str) -> pa.StructArray:
    skip = enc.row_prefix
    rows = slice_bytes(rows, skip) if skip else rows
    if enc.avro:
        # Avro rows: 0x00 version byte, int16 schema id, then the Avro record. A NullType-only
        # schema (e.g. timers' `__dummy__`) encodes to nothing after the prefix.
        return decode_avro_rows(rows, parse_schema(schema_json), path)
    return decode_unsafe_rows(rows, parse_schema(schema_json), path)


def decode_key(
    keys: pa.Array, desc: StoreDescription, enc: StoreEncoding, path: str
) -> pa.StructArray:
    """Key bytes (column family id already stripped) -> the key struct. A backend without key
    encoders (HDFS) stores the key row as it is."""
    spec = desc.key_encoder_spec.get("keyStateEncoderType", "NoPrefixKeyStateEncoderSpec")
    n_prefix = desc.num_cols_prefix_key
    plain = spec == "NoPrefixKeyStateEncoderSpec" and n_prefix == 0
    if plain or not enc.store_backend.capabilities.key_encoders:
        return decode_rows(keys, desc.key_schema, enc, path)
    if spec in ("TimestampAsPostfixKeyStateEncoderSpec", "TimestampAsPrefixKeyStateEncoderSpec"):
        return _decode_timestamp_key(
            keys, desc, enc, path, postfix=spec.startswith("TimestampAsPost")
        )
    if spec in ("PrefixKeyScanStateEncoderSpec", "NoPrefixKeyStateEncoderSpec"):
        fields = _struct_fields(desc.key_schema)
        plen = read_le_int(keys, 0, 4)
        prefix = slice_bytes(keys, 4, 4 + plen)
        rest = slice_bytes(keys, 4 + plen)
        if enc.avro:
            # The prefix part of an Avro prefix-scan key carries no schema id.
            head = decode_avro_rows(
                slice_bytes(prefix, 1), parse_schema(_sub_schema(fields[:n_prefix])), path
            )
        else:
            head = decode_rows(prefix, _sub_schema(fields[:n_prefix]), enc, path)
        tail = decode_rows(rest, _sub_schema(fields[n_prefix:]), enc, path)
        arrays = [head.field(i) for i in range(head.type.num_fields)]
        arrays += [tail.field(i) for i in range(tail.type.num_fields)]
        # The fields, not just their names: a non-nullable column (Spark 4.2's session start)
        # stays non-nullable, as the savepoint's schema (from the schema file) has it.
        return pa.StructArray.from_arrays(arrays, fields=[*head.type, *tail.type])
    raise UnsupportedError(f"key encoder {spec} is not supported yet", path)


def _decode_timestamp_key(
    keys: pa.Array, desc: StoreDescription, enc: StoreEncoding, path: str, *, postfix: bool
) -> pa.StructArray:
    """Join state format 4 keys: the key row without its last field, the event time, with the
    time's 8 bytes (big-endian, sign bit flipped) after (postfix) or before (prefix) the row."""
    if enc.avro:
        raise UnsupportedError("timestamp-keyed state in Avro encoding is not supported yet", path)
    fields = _struct_fields(desc.key_schema)
    data, offsets = binary_parts(keys)
    lengths = offsets[1:] - offsets[:-1]
    if np.any(lengths < 9):
        raise CorruptFileError("timestamp key shorter than its 8-byte event time", path)
    at = offsets[1:] - 8 if postfix else offsets[:-1]
    times = read_be_times(data[at[:, None] + np.arange(8)])
    rows = slice_bytes(keys, 0, lengths - 8) if postfix else slice_bytes(keys, 8)
    head = decode_rows(rows, _sub_schema(fields[:-1]), enc, path)
    arrays = [head.field(i) for i in range(head.type.num_fields)]
    return pa.StructArray.from_arrays(
        [*arrays, pa.array(times, pa.int64())], names=[f["name"] for f in fields]
    )


def check_schema(desc: StoreDescription) -> None:
    """Fail early, naming the schema file, on a type statectl cannot decode."""
    for text in (desc.key_schema, desc.value_schema):
        try:
            to_arrow_schema(text)
        except StatectlError as e:
            raise UnsupportedError(str(e), desc.schema_file) from None


# -- per-operator shapes -------------------------------------------------------------------
def _split_list_blob(blob: bytes, path: str) -> list[bytes]:
    """Elements of one merged list value: ``int32 LE n, n bytes`` each, optionally ``,``-separated.

    Spark joins merge operands with "," (mergeOperatorVersion 1) or nothing (2), and the RocksDB
    binding we read snapshots with joins unmerged operands with ",". A comma is therefore skipped
    between elements; when an element length could itself start with 0x2C (Avro rows; UnsafeRow
    element lengths are always 1 mod 8 and cannot), both readings are tried.
    """

    def parse(pos: int) -> list[bytes] | None:
        out: list[bytes] = []
        while pos < len(blob):
            if pos + 4 > len(blob):
                return None
            n = int.from_bytes(blob[pos : pos + 4], "little", signed=True)
            if n < 0 or pos + 4 + n > len(blob):
                return None
            out.append(blob[pos + 4 : pos + 4 + n])
            pos += 4 + n
            if pos < len(blob) and blob[pos] == 0x2C:
                rest = parse(pos + 1)
                if rest is not None:
                    return out + rest
        return out

    elements = parse(0)
    if elements is None:
        raise StatectlError("list-state value does not split into length-prefixed elements", path)
    return elements


def split_list_values(values: pa.Array, path: str) -> tuple[np.ndarray, pa.LargeBinaryArray]:
    """Split merged list values into elements: (owner index per element, element bytes).

    A Python loop over keys: list state is the one shape whose row count is not the key count.
    """
    owners: list[int] = []
    elements: list[bytes] = []
    for i, blob in enumerate(values.to_pylist()):
        if blob is None:
            continue
        parts = _split_list_blob(blob, path)
        elements.extend(parts)
        owners.extend([i] * len(parts))
    return np.array(owners, dtype=np.int64), pa.array(elements, type=pa.large_binary())
