//! Pure-Rust check of a GGUF file's header, done before llama.cpp sees the file.
//!
//! llama.cpp aborts the whole process on some corrupt files, so we parse the
//! header, the metadata and every tensor description ourselves and turn any problem
//! into a short message. Tensor data is never read; only its offsets are compared
//! with the file length. The checks mirror `gguf_init_from_reader` in the vendored
//! `ggml/src/gguf.cpp` plus the model loader's "data within the file bounds"
//! check, so whatever llama.cpp would reject is rejected here first.
//!
//! The same parse yields the metadata used by `--list-models` and the KV-cache
//! memory estimate.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::path::Path;

/// Limits copied from llama.cpp so we reject exactly what it rejects.
const GGUF_MAX_STRING_LENGTH: u64 = 1 << 30;
const GGUF_MAX_ARRAY_ELEMENTS: u64 = 1 << 30;
const GGML_MAX_DIMS: u32 = 4;
/// GGML_MAX_NAME is 64 including the terminating NUL.
const MAX_TENSOR_NAME_LEN: u64 = 63;
const DEFAULT_ALIGNMENT: u64 = 32;

/// Smallest possible encodings, used to reject absurd counts before looping:
/// key length (8) + 1-byte key + value type (4) + 1-byte value.
const MIN_KV_BYTES: u64 = 14;
/// name length (8) + 1-byte name + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 25;

const TYPE_BOOL: u32 = 7;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
const TYPE_U32: u32 = 4;

/// What `inspect` learned about a GGUF file that passed every check.
#[derive(Debug, Clone)]
pub struct GgufInfo {
    pub file_size: u64,
    /// Sum over tensors of the product of their dimensions.
    pub parameter_count: u64,
    /// Every metadata key; arrays other than short integer ones are kept
    /// only as their length.
    pub metadata: BTreeMap<String, MetaValue>,
}

/// A metadata value, widened to the largest type of its kind.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// An array of integers short enough to keep (per-layer counts).
    Ints(Vec<i64>),
    /// Any other array, kept only as its length.
    Array {
        len: u64,
    },
}

impl GgufInfo {
    /// `general.architecture`, e.g. "llama" or "gemma3".
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// An integer value of any width and signedness, if it is non-negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        match self.metadata.get(key)? {
            MetaValue::UInt(v) => Some(*v),
            MetaValue::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key)? {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An architecture-scoped integer, e.g. `arch_u64("block_count")` reads
    /// `llama.block_count` for a llama model.
    pub fn arch_u64(&self, suffix: &str) -> Option<u64> {
        let arch = self.architecture()?;
        self.get_u64(&format!("{arch}.{suffix}"))
    }

    /// An architecture-scoped array of non-negative integers (a per-layer value).
    pub fn arch_u64_list(&self, suffix: &str) -> Option<Vec<u64>> {
        let arch = self.architecture()?;
        match self.metadata.get(&format!("{arch}.{suffix}"))? {
            MetaValue::Ints(v) => v.iter().map(|&i| u64::try_from(i).ok()).collect(),
            _ => None,
        }
    }
}

/// Why a file was rejected; the message is meant to be shown after the path.
#[derive(Debug)]
pub struct GgufError(pub String);

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GgufError {}

fn fail<T>(msg: impl Into<String>) -> Result<T, GgufError> {
    Err(GgufError(msg.into()))
}

/// Parses and checks the whole GGUF header of `path` without loading weights.
pub fn inspect(path: &Path) -> Result<GgufInfo, GgufError> {
    // Opening a directory succeeds on Linux, so look at the metadata first.
    let meta = std::fs::metadata(path).map_err(open_error)?;
    if meta.is_dir() {
        return fail("is a directory, not a model file");
    }
    if !meta.is_file() {
        // FIFOs and devices would block or lie about their length.
        return fail("is not a regular file");
    }
    let file = File::open(path).map_err(open_error)?;
    // Take the length from the open handle so it matches what we read.
    let file_size = file.metadata().map_err(open_error)?.len();
    parse(file, file_size)
}

fn open_error(e: io::Error) -> GgufError {
    match e.kind() {
        io::ErrorKind::NotFound => GgufError("no such file".into()),
        io::ErrorKind::PermissionDenied => GgufError("permission denied".into()),
        _ => GgufError(format!("cannot open: {e}")),
    }
}

/// Reads a stream of `len` bytes, tracking the position so that every read can
/// be checked against the end of the file before it happens.
struct Reader<R> {
    inner: BufReader<R>,
    pos: u64,
    len: u64,
}

/// Describes what is being read, for error messages; only called on failure.
type What<'a> = &'a dyn Fn() -> String;

impl<R: Read + Seek> Reader<R> {
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    /// Fails with a "truncated" message unless `n` more bytes exist.
    fn need(&self, n: u64, what: What) -> Result<(), GgufError> {
        let end = self.pos.saturating_add(n);
        if end > self.len {
            return fail(format!(
                "truncated: {} needs bytes {}..{} but the file ends at {}",
                what(),
                self.pos,
                end,
                self.len
            ));
        }
        Ok(())
    }

    fn io_error(&self, e: io::Error) -> GgufError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            // We checked the length up front, so the file shrank under us.
            GgufError(format!(
                "truncated: the file ended early at byte {} (was it changed while being read?)",
                self.pos
            ))
        } else {
            GgufError(format!("read error at byte {}: {e}", self.pos))
        }
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N], GgufError> {
        let n = N as u64;
        self.need(n, what)?;
        let mut buf = [0u8; N];
        if let Err(e) = self.inner.read_exact(&mut buf) {
            return Err(self.io_error(e));
        }
        self.pos += n;
        Ok(buf)
    }

    fn u8(&mut self, what: What) -> Result<u8, GgufError> {
        let [b] = self.array::<1>(what)?;
        Ok(b)
    }

    fn u32(&mut self, what: What) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Callers must have bounded `n` (it is checked against the file here too,
    /// before allocating).
    fn bytes(&mut self, n: u64, what: What) -> Result<Vec<u8>, GgufError> {
        self.need(n, what)?;
        let Ok(size) = usize::try_from(n) else {
            return fail(format!("{} is too large for this machine", what()));
        };
        let mut buf = vec![0u8; size];
        if let Err(e) = self.inner.read_exact(&mut buf) {
            return Err(self.io_error(e));
        }
        self.pos += n;
        Ok(buf)
    }

    fn skip(&mut self, n: u64, what: What) -> Result<(), GgufError> {
        self.need(n, what)?;
        let Ok(delta) = i64::try_from(n) else {
            return fail(format!("{} is too large to skip", what()));
        };
        // seek_relative keeps the buffer when the target is inside it, which
        // matters for the hundreds of thousands of tokenizer strings.
        if let Err(e) = self.inner.seek_relative(delta) {
            return Err(self.io_error(e));
        }
        self.pos += n;
        Ok(())
    }

    /// Reads a string's u64 length and checks it like llama.cpp does, without
    /// allocating anything yet.
    fn string_len(&mut self, what: What, field: &str) -> Result<u64, GgufError> {
        let len = self.u64(what)?;
        if len > GGUF_MAX_STRING_LENGTH {
            return fail(format!(
                "corrupt header: {} has a {field} length of {len} bytes (the maximum is {GGUF_MAX_STRING_LENGTH})",
                what()
            ));
        }
        if len > self.remaining() {
            return fail(format!(
                "truncated or corrupt header: {} has a {field} length of {len} bytes, but only {} bytes are left in the file",
                what(),
                self.remaining()
            ));
        }
        Ok(len)
    }

    fn string(&mut self, what: What, field: &str) -> Result<Vec<u8>, GgufError> {
        let len = self.string_len(what, field)?;
        self.bytes(len, what)
    }
}

/// Size of one value of a fixed-size GGUF type; None for string, array, unknown.
fn gguf_fixed_size(vtype: u32) -> Option<u64> {
    match vtype {
        0 | 1 | TYPE_BOOL => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn gguf_type_name(vtype: u32) -> &'static str {
    match vtype {
        0 => "u8",
        1 => "i8",
        2 => "u16",
        3 => "i16",
        4 => "u32",
        5 => "i32",
        6 => "f32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "u64",
        11 => "i64",
        12 => "f64",
        _ => "unknown type",
    }
}

/// Block layout of a ggml tensor type.
#[derive(Debug, Clone, Copy, PartialEq)]
struct GgmlType {
    name: &'static str,
    block_size: u64,
    type_size: u64,
}

enum TypeLookup {
    Known(GgmlType),
    /// Ids that once existed and llama.cpp now refuses (block size 0 there).
    Removed(&'static str),
    Unknown,
}

/// `type_traits` from the vendored ggml/src/ggml.c (GGML_TYPE_COUNT = 43).
fn ggml_type(id: u32) -> TypeLookup {
    const fn k(name: &'static str, block_size: u64, type_size: u64) -> TypeLookup {
        TypeLookup::Known(GgmlType {
            name,
            block_size,
            type_size,
        })
    }
    match id {
        0 => k("F32", 1, 4),
        1 => k("F16", 1, 2),
        2 => k("Q4_0", 32, 18),
        3 => k("Q4_1", 32, 20),
        4 => TypeLookup::Removed("Q4_2"),
        5 => TypeLookup::Removed("Q4_3"),
        6 => k("Q5_0", 32, 22),
        7 => k("Q5_1", 32, 24),
        8 => k("Q8_0", 32, 34),
        9 => k("Q8_1", 32, 36),
        10 => k("Q2_K", 256, 84),
        11 => k("Q3_K", 256, 110),
        12 => k("Q4_K", 256, 144),
        13 => k("Q5_K", 256, 176),
        14 => k("Q6_K", 256, 210),
        15 => k("Q8_K", 256, 292),
        16 => k("IQ2_XXS", 256, 66),
        17 => k("IQ2_XS", 256, 74),
        18 => k("IQ3_XXS", 256, 98),
        19 => k("IQ1_S", 256, 50),
        20 => k("IQ4_NL", 32, 18),
        21 => k("IQ3_S", 256, 110),
        22 => k("IQ2_S", 256, 82),
        23 => k("IQ4_XS", 256, 136),
        24 => k("I8", 1, 1),
        25 => k("I16", 1, 2),
        26 => k("I32", 1, 4),
        27 => k("I64", 1, 8),
        28 => k("F64", 1, 8),
        29 => k("IQ1_M", 256, 56),
        30 => k("BF16", 1, 2),
        31 => TypeLookup::Removed("Q4_0_4_4"),
        32 => TypeLookup::Removed("Q4_0_4_8"),
        33 => TypeLookup::Removed("Q4_0_8_8"),
        34 => k("TQ1_0", 256, 54),
        35 => k("TQ2_0", 256, 66),
        36 => TypeLookup::Removed("IQ4_NL_4_4"),
        37 => TypeLookup::Removed("IQ4_NL_4_8"),
        38 => TypeLookup::Removed("IQ4_NL_8_8"),
        39 => k("MXFP4", 32, 17),
        40 => k("NVFP4", 64, 36),
        41 => k("Q1_0", 128, 18),
        42 => k("Q2_0", 64, 18),
        _ => TypeLookup::Unknown,
    }
}

/// Names from the file, made safe and short for one-line messages.
fn shown(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == 80 {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Explains a wrong magic, recognising the usual suspects of a bad download.
fn bad_magic<R: Read + Seek>(magic: [u8; 4], r: &mut Reader<R>) -> GgufError {
    // A little more context helps to recognise LFS pointers and safetensors;
    // this is best effort, so a read error just means no hint.
    let extra = r.remaining().min(28);
    let mut head = magic.to_vec();
    if let Ok(more) = r.bytes(extra, &|| "the file start".into()) {
        head.extend(more);
    }
    let base = format!(
        "not a GGUF file (starts with bytes {}, expected \"GGUF\")",
        hex(&magic)
    );
    let first = head.iter().copied().find(|b| !b.is_ascii_whitespace());
    let hint = if head.starts_with(b"version https://git-lfs") {
        "; it is a Git LFS pointer, not the model itself (run `git lfs pull` or download the file directly)"
    } else if head.get(8..10) == Some(b"{\"".as_slice()) {
        "; it looks like a safetensors file, convert it to GGUF first"
    } else if [b"lmgg", b"fmgg", b"tjgg", b"algg"].contains(&&magic) {
        "; it is in the old GGML format, convert it to GGUF"
    } else if first == Some(b'<') {
        "; it looks like an HTML page, probably a failed download"
    } else if first == Some(b'{') || first == Some(b'[') {
        "; it looks like JSON text, probably a failed download"
    } else {
        ""
    };
    GgufError(format!("{base}{hint}"))
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    // alignment is a non-zero power of two, checked when it was read.
    x.checked_add(alignment - 1).map(|v| v & !(alignment - 1))
}

/// Where a tensor's bytes live, kept until the data section start is known.
struct TensorSpan {
    name: String,
    offset: u64,
    nbytes: u64,
}

fn parse<R: Read + Seek>(src: R, file_size: u64) -> Result<GgufInfo, GgufError> {
    if file_size == 0 {
        return fail("file is empty");
    }
    if file_size < 4 {
        return fail(format!(
            "not a GGUF file (only {file_size} bytes long, expected \"GGUF\" at the start)"
        ));
    }
    let mut r = Reader {
        inner: BufReader::with_capacity(1 << 16, src),
        pos: 0,
        len: file_size,
    };
    let header: What = &|| "the file header".to_string();

    let magic: [u8; 4] = r.array(header)?;
    if magic != *b"GGUF" {
        return Err(bad_magic(magic, &mut r));
    }

    let version = r.u32(header)?;
    match version {
        2 | 3 => {}
        0 => return fail("unsupported GGUF version 0 (supported: 2, 3)"),
        // A big-endian v3 file read little-endian shows up as 0x03000000.
        v if v & 0xFFFF == 0 => {
            return fail(format!(
                "unsupported GGUF version {v} (supported: 2, 3); the file looks big-endian, which llama.cpp cannot load here"
            ))
        }
        1 => {
            return fail(
                "unsupported GGUF version 1 (supported: 2, 3); re-convert the model with a current llama.cpp",
            )
        }
        v => return fail(format!("unsupported GGUF version {v} (supported: 2, 3)")),
    }

    let tensor_count = r.u64(header)?;
    let kv_count = r.u64(header)?;
    // Every entry takes a minimum number of bytes, so a count that cannot fit in
    // the file is corrupt; this fails fast instead of looping over garbage.
    for (count, min, what) in [
        (kv_count, MIN_KV_BYTES, "metadata"),
        (tensor_count, MIN_TENSOR_INFO_BYTES, "tensor"),
    ] {
        if count > r.remaining() / min {
            return fail(format!(
                "truncated or corrupt header: {what} count {count} does not fit in the remaining {} bytes of the file",
                r.remaining()
            ));
        }
    }

    let mut metadata = BTreeMap::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..kv_count {
        let key_bytes = r.string(&|| format!("metadata key {i}"), "name")?;
        if key_bytes.is_empty() {
            return fail(format!(
                "corrupt header: metadata key {i} has an empty name"
            ));
        }
        let Ok(key) = String::from_utf8(key_bytes) else {
            return fail(format!(
                "corrupt header: metadata key {i} has a name that is not valid UTF-8"
            ));
        };
        if metadata.contains_key(&key) {
            return fail(format!(
                "corrupt header: duplicate metadata key `{}`",
                shown(&key)
            ));
        }
        let what = || format!("metadata key `{}`", shown(&key));
        let vtype = r.u32(&what)?;
        let value = if vtype == TYPE_ARRAY {
            read_array(&mut r, &what)?
        } else {
            read_value(&mut r, vtype, &what)?
        };

        if key == "general.alignment" {
            alignment = match &value {
                MetaValue::UInt(a) if vtype == TYPE_U32 => *a,
                _ => {
                    return fail(format!(
                        "corrupt header: `general.alignment` has type {}, expected u32",
                        gguf_type_name(vtype)
                    ))
                }
            };
            if !alignment.is_power_of_two() {
                return fail(format!(
                    "corrupt header: `general.alignment` is {alignment}, which is not a power of two"
                ));
            }
        }
        metadata.insert(key, value);
    }

    if tensor_count > r.remaining() / MIN_TENSOR_INFO_BYTES {
        return fail(format!(
            "truncated or corrupt header: tensor count {tensor_count} does not fit in the remaining {} bytes of the file",
            r.remaining()
        ));
    }

    let mut seen_names: HashSet<Vec<u8>> = HashSet::new();
    let mut spans: Vec<TensorSpan> = Vec::new();
    let mut parameter_count: u64 = 0;
    for i in 0..tensor_count {
        let info_what = || format!("tensor info {i}");
        let name_len = r.u64(&info_what)?;
        if name_len == 0 {
            return fail(format!("corrupt header: tensor info {i} has an empty name"));
        }
        // Checked before reading so a huge length never allocates.
        if name_len > MAX_TENSOR_NAME_LEN {
            return fail(format!(
                "corrupt header: tensor info {i} has a name length of {name_len} bytes (the maximum is {MAX_TENSOR_NAME_LEN})"
            ));
        }
        let raw = r.bytes(name_len, &info_what)?;
        let name = String::from_utf8_lossy(&raw).into_owned();
        if !seen_names.insert(raw) {
            return fail(format!(
                "corrupt header: duplicate tensor name `{}`",
                shown(&name)
            ));
        }
        let what = || format!("tensor `{}`", shown(&name));

        let n_dims = r.u32(&what)?;
        // llama.cpp accepts 0 dimensions (a scalar) and zero-sized dimensions,
        // so we do too; it only rejects more than GGML_MAX_DIMS.
        if n_dims > GGML_MAX_DIMS {
            return fail(format!(
                "corrupt header: {} has {n_dims} dimensions (the maximum is {GGML_MAX_DIMS})",
                what()
            ));
        }
        let mut ne = [1i64; GGML_MAX_DIMS as usize];
        for (j, dim) in ne.iter_mut().take(n_dims as usize).enumerate() {
            let raw_dim = r.u64(&what)?;
            // llama.cpp reads dims as int64 and rejects negative ones.
            let Ok(d) = i64::try_from(raw_dim) else {
                return fail(format!(
                    "corrupt header: {} dimension {j} is {raw_dim}, which is out of range",
                    what()
                ));
            };
            *dim = d;
        }
        let shape = || {
            let dims: Vec<String> = ne
                .iter()
                .take(n_dims as usize)
                .map(|d| d.to_string())
                .collect();
            format!("[{}]", dims.join(", "))
        };
        let Some(nelements) = ne.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d)) else {
            return fail(format!(
                "corrupt header: {} has shape {}, whose element count overflows",
                what(),
                shape()
            ));
        };

        let type_id = r.u32(&what)?;
        let ty = match ggml_type(type_id) {
            TypeLookup::Known(t) => t,
            TypeLookup::Removed(old) => {
                return fail(format!(
                    "{} uses ggml type {old} (id {type_id}), which llama.cpp no longer loads; use a model quantized by a current llama.cpp",
                    what()
                ))
            }
            // Ids just past the table are most likely newer quantisations.
            TypeLookup::Unknown if type_id < 64 => {
                return fail(format!(
                    "{} has ggml type id {type_id}, which this build does not know; it may need a newer cmpl",
                    what()
                ))
            }
            TypeLookup::Unknown => {
                return fail(format!(
                    "corrupt header: {} has type id {type_id}, which is not a ggml type",
                    what()
                ))
            }
        };
        // Dimensions are non-negative here, so these conversions cannot fail.
        let ne0 = u64::try_from(ne[0]).unwrap_or(0);
        let elements = u64::try_from(nelements).unwrap_or(0);
        if ne0 % ty.block_size != 0 {
            return fail(format!(
                "corrupt header: {} has {ne0} elements per row, which is not a multiple of the {} block size {}",
                what(),
                ty.name,
                ty.block_size
            ));
        }
        let Some(nbytes) = (elements / ty.block_size).checked_mul(ty.type_size) else {
            return fail(format!(
                "corrupt header: {} with shape {} is too large",
                what(),
                shape()
            ));
        };

        let offset = r.u64(&what)?;
        let Some(total) = parameter_count.checked_add(elements) else {
            return fail("corrupt header: the total parameter count overflows");
        };
        parameter_count = total;
        spans.push(TensorSpan {
            name,
            offset,
            nbytes,
        });
    }

    // The data section starts at the next multiple of the alignment.
    let Some(data_start) = align_up(r.pos, alignment) else {
        return fail("corrupt header: the data section offset overflows");
    };
    if tensor_count > 0 && data_start > file_size {
        return fail(format!(
            "truncated: the tensor data section starts at byte {data_start} but the file ends at {file_size}"
        ));
    }

    // llama.cpp requires the tensors to be packed in order, each starting at
    // the previous one's end rounded up to the alignment. This pass runs over
    // all tensors before any bounds check so that a corrupt shape or offset is
    // reported as such, and "truncated" is only said of a consistent header.
    let mut expected: u64 = 0;
    let mut previous: Option<&str> = None;
    for t in &spans {
        let name = shown(&t.name);
        if t.offset % alignment != 0 {
            return fail(format!(
                "corrupt header: tensor `{name}` has offset {}, which is not a multiple of the alignment {alignment}",
                t.offset
            ));
        }
        if t.offset != expected {
            let why = match previous {
                None => "the first tensor must start at 0".to_string(),
                Some(prev) if t.offset < expected => format!(
                    "it overlaps the previous tensor `{}`, which ends at {expected}",
                    shown(prev)
                ),
                Some(prev) => format!(
                    "the previous tensor `{}` ends at {expected} and tensors must be packed in order",
                    shown(prev)
                ),
            };
            return fail(format!(
                "corrupt header: tensor `{name}` has offset {}; {why}",
                t.offset
            ));
        }
        let Some(next) = t
            .offset
            .checked_add(t.nbytes)
            .and_then(|e| align_up(e, alignment))
        else {
            return fail(format!(
                "corrupt header: tensor `{name}` has a size that overflows"
            ));
        };
        expected = next;
        previous = Some(&t.name);
    }

    // Same check as llama.cpp's model loader: every tensor's bytes must lie
    // inside the file. Offsets are consistent here, so a miss means truncation.
    for t in &spans {
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.nbytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_size => {}
            (start, end) => {
                return fail(format!(
                    "truncated: tensor `{}` needs bytes {}..{} but the file ends at {file_size}",
                    shown(&t.name),
                    start.unwrap_or(u64::MAX),
                    end.unwrap_or(u64::MAX)
                ))
            }
        }
    }

    Ok(GgufInfo {
        file_size,
        parameter_count,
        metadata,
    })
}

/// Reads one non-array value of GGUF type `vtype`.
fn read_value<R: Read + Seek>(
    r: &mut Reader<R>,
    vtype: u32,
    what: What,
) -> Result<MetaValue, GgufError> {
    let v = match vtype {
        0 => MetaValue::UInt(r.u8(what)?.into()),
        1 => MetaValue::Int(i8::from_le_bytes(r.array(what)?).into()),
        2 => MetaValue::UInt(u16::from_le_bytes(r.array(what)?).into()),
        3 => MetaValue::Int(i16::from_le_bytes(r.array(what)?).into()),
        4 => MetaValue::UInt(r.u32(what)?.into()),
        5 => MetaValue::Int(i32::from_le_bytes(r.array(what)?).into()),
        6 => MetaValue::Float(f32::from_le_bytes(r.array(what)?).into()),
        TYPE_BOOL => MetaValue::Bool(read_bool(r, what)?),
        TYPE_STRING => {
            let bytes = r.string(what, "string")?;
            // llama.cpp does not require UTF-8 in values, so neither do we.
            MetaValue::Str(String::from_utf8_lossy(&bytes).into_owned())
        }
        10 => MetaValue::UInt(r.u64(what)?),
        11 => MetaValue::Int(i64::from_le_bytes(r.array(what)?)),
        12 => MetaValue::Float(f64::from_le_bytes(r.array(what)?)),
        _ => {
            return fail(format!(
                "corrupt header: {} has value type id {vtype}, which is not a GGUF type",
                what()
            ))
        }
    };
    Ok(v)
}

fn read_bool<R: Read + Seek>(r: &mut Reader<R>, what: What) -> Result<bool, GgufError> {
    // Writers emit 0 or 1; anything else means the bytes are not what we think.
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        b => fail(format!(
            "corrupt header: {} has bool value {b} (expected 0 or 1)",
            what()
        )),
    }
}

/// Checks and skips an array value (after its type id), returning its length.
/// Integer arrays up to this length are kept (per-layer values); longer
/// ones and all others are skipped.
const KEPT_INTS: u64 = 4096;

fn read_array<R: Read + Seek>(r: &mut Reader<R>, what: What) -> Result<MetaValue, GgufError> {
    let elem = r.u32(what)?;
    if elem == TYPE_ARRAY {
        return fail(format!(
            "corrupt header: {} is an array of arrays, which llama.cpp does not support",
            what()
        ));
    }
    if gguf_fixed_size(elem).is_none() && elem != TYPE_STRING {
        return fail(format!(
            "corrupt header: {} is an array of type id {elem}, which is not a GGUF type",
            what()
        ));
    }
    let n = r.u64(what)?;
    if n > GGUF_MAX_ARRAY_ELEMENTS {
        return fail(format!(
            "corrupt header: {} has an array of {n} elements (the maximum is {GGUF_MAX_ARRAY_ELEMENTS})",
            what()
        ));
    }
    // Strings are at least their 8-byte length, as llama.cpp also assumes.
    let min_bytes = n.saturating_mul(gguf_fixed_size(elem).unwrap_or(8));
    if min_bytes > r.remaining() {
        return fail(format!(
            "truncated or corrupt header: {} has an array of {n} {} values, which needs at least {min_bytes} bytes, but only {} are left in the file",
            what(),
            gguf_type_name(elem),
            r.remaining()
        ));
    }
    match elem {
        0..=5 | 10 | 11 if n <= KEPT_INTS => {
            let mut ints = Vec::with_capacity(n as usize);
            for _ in 0..n {
                ints.push(match read_value(r, elem, what)? {
                    MetaValue::Int(i) => i,
                    MetaValue::UInt(u) => i64::try_from(u).unwrap_or(i64::MAX),
                    _ => 0,
                });
            }
            return Ok(MetaValue::Ints(ints));
        }
        TYPE_STRING => {
            for j in 0..n {
                let item = || format!("{} element {j}", what());
                let len = r.string_len(&item, "string")?;
                r.skip(len, &item)?;
            }
        }
        TYPE_BOOL => {
            for _ in 0..n {
                read_bool(r, what)?;
            }
        }
        _ => r.skip(min_bytes, what)?,
    }
    Ok(MetaValue::Array { len: n })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const F32: u32 = 0;
    const F16: u32 = 1;
    const Q4_K: u32 = 12;
    const F64: u32 = 28;

    fn put_str(buf: &mut Vec<u8>, s: &[u8]) {
        buf.extend((s.len() as u64).to_le_bytes());
        buf.extend(s);
    }

    struct Tensor {
        name: Vec<u8>,
        dims: Vec<u64>,
        ty: u32,
        /// None: packed after the previous tensor, like a real writer.
        offset: Option<u64>,
    }

    /// Builds small GGUF files in memory.
    struct Builder {
        version: u32,
        kv_count: u64,
        kvs: Vec<u8>,
        tensors: Vec<Tensor>,
        alignment: u64,
    }

    impl Builder {
        fn new() -> Self {
            Builder {
                version: 3,
                kv_count: 0,
                kvs: Vec::new(),
                tensors: Vec::new(),
                alignment: 32,
            }
        }

        /// Any value: type id plus its raw encoding.
        fn kv(mut self, key: &str, vtype: u32, value: &[u8]) -> Self {
            put_str(&mut self.kvs, key.as_bytes());
            self.kvs.extend(vtype.to_le_bytes());
            self.kvs.extend(value);
            self.kv_count += 1;
            self
        }

        fn kv_str(self, key: &str, value: &str) -> Self {
            let mut v = Vec::new();
            put_str(&mut v, value.as_bytes());
            self.kv(key, 8, &v)
        }

        fn kv_u32(self, key: &str, value: u32) -> Self {
            self.kv(key, 4, &value.to_le_bytes())
        }

        fn alignment(mut self, a: u32) -> Self {
            // Zero is invalid, but the builder still has to produce bytes.
            self.alignment = u64::from(a).max(1);
            self.kv_u32("general.alignment", a)
        }

        fn tensor(mut self, name: &str, dims: &[u64], ty: u32) -> Self {
            self.tensors.push(Tensor {
                name: name.as_bytes().to_vec(),
                dims: dims.to_vec(),
                ty,
                offset: None,
            });
            self
        }

        fn tensor_at(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
            self.tensor_raw(name.as_bytes(), dims, ty, Some(offset));
            self
        }

        fn tensor_raw(&mut self, name: &[u8], dims: &[u64], ty: u32, offset: Option<u64>) {
            self.tensors.push(Tensor {
                name: name.to_vec(),
                dims: dims.to_vec(),
                ty,
                offset,
            });
        }

        fn nbytes(t: &Tensor) -> u64 {
            let TypeLookup::Known(ty) = ggml_type(t.ty) else {
                return 0;
            };
            let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            (n.unwrap_or(0) / ty.block_size).saturating_mul(ty.type_size)
        }

        fn build(&self) -> Vec<u8> {
            let pad = |x: u64| {
                x.checked_next_multiple_of(self.alignment)
                    .unwrap_or(u64::MAX)
            };
            let mut b = b"GGUF".to_vec();
            b.extend(self.version.to_le_bytes());
            b.extend((self.tensors.len() as u64).to_le_bytes());
            b.extend(self.kv_count.to_le_bytes());
            b.extend(&self.kvs);
            let mut next = 0u64;
            let mut data_end = 0u64;
            for t in &self.tensors {
                put_str(&mut b, &t.name);
                b.extend((t.dims.len() as u32).to_le_bytes());
                for d in &t.dims {
                    b.extend(d.to_le_bytes());
                }
                b.extend(t.ty.to_le_bytes());
                let off = t.offset.unwrap_or(next);
                b.extend(off.to_le_bytes());
                let end = off.saturating_add(Self::nbytes(t));
                next = pad(end);
                data_end = data_end.max(end.min(1 << 20));
            }
            let data_start = pad(b.len() as u64);
            b.resize((data_start + data_end) as usize, 0);
            b
        }
    }

    /// A small but complete model-like file.
    fn valid() -> Builder {
        let mut tokens = Vec::new();
        tokens.extend(8u32.to_le_bytes());
        tokens.extend(3u64.to_le_bytes());
        for t in ["<s>", "a", "bc"] {
            put_str(&mut tokens, t.as_bytes());
        }
        let mut ints = Vec::new();
        ints.extend(5u32.to_le_bytes());
        ints.extend(2u64.to_le_bytes());
        ints.extend((-1i32).to_le_bytes());
        ints.extend(7i32.to_le_bytes());
        let mut per_layer = Vec::new();
        per_layer.extend(4u32.to_le_bytes());
        per_layer.extend(2u64.to_le_bytes());
        per_layer.extend(8u32.to_le_bytes());
        per_layer.extend(0u32.to_le_bytes());
        Builder::new()
            .kv_str("general.architecture", "llama")
            .kv_str("general.name", "tiny")
            .kv_u32("llama.block_count", 2)
            .kv("llama.context_length", 10, &4096u64.to_le_bytes())
            .kv("llama.rope.freq_base", 6, &10000f32.to_le_bytes())
            .kv("llama.use_parallel_residual", 7, &[1])
            .kv("llama.some_signed", 11, &(-5i64).to_le_bytes())
            .kv("tokenizer.ggml.tokens", 9, &tokens)
            .kv("llama.ints", 9, &ints)
            .kv("llama.per_layer", 9, &per_layer)
            .tensor("token_embd.weight", &[256, 2], Q4_K)
            .tensor("blk.0.attn_q.weight", &[8, 8], F32)
            .tensor("output_norm.weight", &[8], F16)
    }

    static COUNTER: AtomicUsize = AtomicUsize::new(0);

    fn temp_path(tag: &str) -> PathBuf {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        std::env::temp_dir().join(format!(
            "cmpl-gguf-test-{}-{tag}-{n}.gguf",
            std::process::id()
        ))
    }

    fn check(bytes: &[u8]) -> Result<GgufInfo, GgufError> {
        let path = temp_path("file");
        std::fs::write(&path, bytes).unwrap();
        let result = inspect(&path);
        std::fs::remove_file(&path).unwrap();
        result
    }

    fn err(bytes: &[u8]) -> String {
        match check(bytes) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    fn assert_err(bytes: &[u8], needle: &str) {
        let msg = err(bytes);
        assert!(msg.contains(needle), "{msg:?} does not contain {needle:?}");
    }

    #[test]
    fn valid_file_passes() {
        let bytes = valid().build();
        let info = check(&bytes).unwrap();
        assert_eq!(info.file_size, bytes.len() as u64);
        assert_eq!(info.parameter_count, 512 + 64 + 8);
        assert_eq!(info.architecture(), Some("llama"));
        assert_eq!(info.get_str("general.name"), Some("tiny"));
        assert_eq!(info.get_u64("llama.block_count"), Some(2));
        assert_eq!(info.arch_u64("block_count"), Some(2));
        assert_eq!(info.arch_u64("context_length"), Some(4096));
        assert_eq!(info.get_u64("llama.some_signed"), None);
        assert_eq!(info.get_u64("general.name"), None);
        assert_eq!(info.get_u64("missing"), None);
        let m = &info.metadata;
        assert_eq!(m["llama.some_signed"], MetaValue::Int(-5));
        assert_eq!(m["llama.rope.freq_base"], MetaValue::Float(10000.0));
        assert_eq!(m["llama.use_parallel_residual"], MetaValue::Bool(true));
        assert_eq!(m["tokenizer.ggml.tokens"], MetaValue::Array { len: 3 });
        assert_eq!(m["llama.ints"], MetaValue::Ints(vec![-1, 7]));
        assert_eq!(
            info.arch_u64_list("ints"),
            None,
            "negative counts are not counts"
        );
        assert_eq!(info.arch_u64_list("per_layer"), Some(vec![8, 0]));
        assert_eq!(m.len(), 10);
    }

    #[test]
    fn version_2_custom_alignment_and_no_tensors_pass() {
        let mut b = valid().alignment(64);
        b.version = 2;
        assert!(check(&b.build()).is_ok());
        let empty = Builder::new().kv_str("general.architecture", "x").build();
        assert_eq!(check(&empty).unwrap().parameter_count, 0);
    }

    #[test]
    fn scalar_and_zero_sized_tensors_pass_like_llama_cpp() {
        let b = Builder::new()
            .tensor("scalar", &[], F32)
            .tensor("empty", &[0, 4], F32);
        let info = check(&b.build()).unwrap();
        assert_eq!(info.parameter_count, 1);
    }

    #[test]
    fn empty_and_tiny_files() {
        assert_eq!(err(b""), "file is empty");
        assert_err(b"GG", "only 2 bytes long");
    }

    #[test]
    fn wrong_magic() {
        assert_eq!(
            err(b"{\"error\": \"not found\"}"),
            "not a GGUF file (starts with bytes 7b 22 65 72, expected \"GGUF\"); it looks like JSON text, probably a failed download"
        );
        assert_err(b"<!DOCTYPE html><html>", "HTML page");
        assert_err(
            b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n",
            "Git LFS pointer",
        );
        assert_err(b"\x10\0\0\0\0\0\0\0{\"a\":1}", "safetensors");
        assert_err(b"tjgg\x03\0\0\0", "old GGML format");
        assert_err(&[0u8; 64], "starts with bytes 00 00 00 00");
    }

    #[test]
    fn bad_versions() {
        for (v, needle) in [
            (7u32, "unsupported GGUF version 7 (supported: 2, 3)"),
            (0, "unsupported GGUF version 0"),
            (1, "version 1 (supported: 2, 3); re-convert"),
            (0x0300_0000, "big-endian"),
        ] {
            let mut b = valid();
            b.version = v;
            assert_err(&b.build(), needle);
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = valid().build();
        let data_start = bytes.len() - (288 + 256 + 16);
        let path = temp_path("prefix");
        for n in 0..bytes.len() {
            std::fs::write(&path, &bytes[..n]).unwrap();
            let e = match inspect(&path) {
                Ok(_) => panic!("prefix of {n} bytes was accepted"),
                Err(e) => e.to_string(),
            };
            assert!(!e.is_empty());
            if n >= data_start {
                assert!(e.starts_with("truncated: tensor `"), "{n}: {e}");
            }
        }
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            err(&bytes[..bytes.len() - 1]),
            format!(
                "truncated: tensor `output_norm.weight` needs bytes {}..{} but the file ends at {}",
                bytes.len() - 16,
                bytes.len(),
                bytes.len() - 1
            )
        );
    }

    #[test]
    fn huge_string_lengths() {
        let mut b = Builder::new();
        b.kvs.extend(u64::MAX.to_le_bytes());
        b.kv_count = 1;
        b.kvs.extend([0u8; 32]);
        assert_eq!(
            err(&b.build()),
            "corrupt header: metadata key 0 has a name length of 18446744073709551615 bytes (the maximum is 1073741824)"
        );

        let value = [1000u64.to_le_bytes().as_slice(), b"abc"].concat();
        assert_err(
            &Builder::new().kv("general.name", 8, &value).build(),
            "metadata key `general.name` has a string length of 1000 bytes, but only 8 bytes are left",
        );

        let mut arr = 8u32.to_le_bytes().to_vec();
        arr.extend(1u64.to_le_bytes());
        arr.extend(u64::MAX.to_le_bytes());
        assert_err(
            &Builder::new().kv("tokens", 9, &arr).build(),
            "`tokens` element 0 has a string length of 18446744073709551615",
        );
    }

    #[test]
    fn bad_metadata_values() {
        assert_err(
            &Builder::new().kv("k", 13, &[0; 8]).build(),
            "metadata key `k` has value type id 13, which is not a GGUF type",
        );
        assert_err(
            &Builder::new().kv("k", 7, &[2]).build(),
            "bool value 2 (expected 0 or 1)",
        );
        let nested = [9u32.to_le_bytes(), 0u32.to_le_bytes()].concat();
        assert_err(
            &Builder::new().kv("k", 9, &nested).build(),
            "array of arrays",
        );
        let bad_elem = [20u32.to_le_bytes().as_slice(), &0u64.to_le_bytes()].concat();
        assert_err(
            &Builder::new().kv("k", 9, &bad_elem).build(),
            "array of type id 20",
        );
        let huge = [4u32.to_le_bytes().as_slice(), &(1u64 << 40).to_le_bytes()].concat();
        assert_err(
            &Builder::new().kv("k", 9, &huge).build(),
            "array of 1099511627776 elements (the maximum is 1073741824)",
        );
        let long = [4u32.to_le_bytes().as_slice(), &1000u64.to_le_bytes()].concat();
        assert_err(
            &Builder::new().kv("k", 9, &long).build(),
            "array of 1000 u32 values, which needs at least 4000 bytes",
        );
        assert_err(
            &Builder::new().kv_u32("k", 1).kv_u32("k", 2).build(),
            "duplicate metadata key `k`",
        );
        assert_err(
            &Builder::new().kv_u32("", 1).build(),
            "metadata key 0 has an empty name",
        );
        assert_err(
            &valid().alignment(48).build(),
            "`general.alignment` is 48, which is not a power of two",
        );
        assert_err(
            &valid().alignment(0).build(),
            "`general.alignment` is 0, which is not a power of two",
        );
        assert_err(
            &Builder::new()
                .kv("general.alignment", 10, &32u64.to_le_bytes())
                .build(),
            "`general.alignment` has type u64, expected u32",
        );
    }

    #[test]
    fn absurd_counts_fail_fast() {
        let mut b = valid().build();
        b[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert_err(
            &b,
            "corrupt header: metadata count 9223372036854775807 does not fit",
        );
        let mut b = valid().build();
        b[8..16].copy_from_slice(&1_000_000u64.to_le_bytes());
        assert_err(&b, "corrupt header: tensor count 1000000 does not fit");
    }

    #[test]
    fn bad_tensor_types() {
        assert_err(
            &valid().tensor("x", &[4], 97).build(),
            "corrupt header: tensor `x` has type id 97, which is not a ggml type",
        );
        assert_err(
            &valid().tensor("x", &[4], u32::MAX).build(),
            "type id 4294967295, which is not a ggml type",
        );
        assert_err(
            &valid().tensor("x", &[32], 31).build(),
            "tensor `x` uses ggml type Q4_0_4_4 (id 31), which llama.cpp no longer loads",
        );
        assert_err(
            &valid().tensor("x", &[32], 4).build(),
            "ggml type Q4_2 (id 4)",
        );
        assert_err(
            &valid().tensor("x", &[4], 50).build(),
            "may need a newer cmpl",
        );
        assert_err(
            &valid().tensor("x", &[100, 2], Q4_K).build(),
            "tensor `x` has 100 elements per row, which is not a multiple of the Q4_K block size 256",
        );
    }

    #[test]
    fn bad_tensor_shapes() {
        assert_err(
            &valid().tensor("x", &[1, 1, 1, 1, 1], F32).build(),
            "tensor `x` has 5 dimensions (the maximum is 4)",
        );
        assert_err(
            &valid().tensor("x", &[u64::MAX], F32).build(),
            "tensor `x` dimension 0 is 18446744073709551615, which is out of range",
        );
        assert_err(
            &valid().tensor("x", &[1 << 40, 1 << 40], F32).build(),
            "whose element count overflows",
        );
        assert_err(
            &valid().tensor("x", &[1 << 61, 2], F64).build(),
            "is too large",
        );
    }

    #[test]
    fn bad_tensor_names() {
        assert_err(
            &valid().tensor("blk.0.attn_q.weight", &[8], F32).build(),
            "duplicate tensor name `blk.0.attn_q.weight`",
        );
        assert_err(
            &valid().tensor("", &[8], F32).build(),
            "tensor info 3 has an empty name",
        );
        assert_err(
            &valid().tensor(&"n".repeat(64), &[8], F32).build(),
            "tensor info 3 has a name length of 64 bytes (the maximum is 63)",
        );
        // 63 bytes is the longest name llama.cpp accepts.
        check(&valid().tensor(&"n".repeat(63), &[8], F32).build()).unwrap();
    }

    #[test]
    fn bad_tensor_offsets() {
        // 256 bytes of F32 data then the next tensor: expected offset is 256.
        let base = || Builder::new().tensor("a", &[64], F32);
        assert_err(
            &base().tensor_at("b", &[8], F32, 0).build(),
            "tensor `b` has offset 0; it overlaps the previous tensor `a`, which ends at 256",
        );
        assert_err(
            &base().tensor_at("b", &[8], F32, 8).build(),
            "tensor `b` has offset 8, which is not a multiple of the alignment 32",
        );
        assert_err(
            &base().tensor_at("b", &[8], F32, 512).build(),
            "tensor `b` has offset 512; the previous tensor `a` ends at 256",
        );
        assert_err(
            &Builder::new().tensor_at("a", &[8], F32, 1 << 40).build(),
            "the first tensor must start at 0",
        );
        // In order but past the end of the file.
        let mut b = base().tensor("b", &[8], F32).build();
        b.truncate(b.len() - 32);
        assert_err(&b, "truncated: tensor `b` needs bytes");
        // Offsets fine but the data section itself lies past the end.
        // Header: 24 bytes, then one info of 8 + 1 + 4 + 8 + 4 + 8 = 33 bytes;
        // the data section starts at 64.
        let b = Builder::new().tensor("a", &[8], F32).build();
        assert_eq!(b.len(), 64 + 32);
        assert_err(
            &b[..60],
            "truncated: the tensor data section starts at byte",
        );
    }

    #[test]
    fn paths_that_are_not_files() {
        let dir = temp_path("dir");
        std::fs::create_dir(&dir).unwrap();
        let e = inspect(&dir).unwrap_err().to_string();
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(e, "is a directory, not a model file");
        let missing = temp_path("missing");
        assert_eq!(inspect(&missing).unwrap_err().to_string(), "no such file");
    }

    #[test]
    fn type_table_matches_ggml() {
        let size = |id| match ggml_type(id) {
            TypeLookup::Known(t) => Some((t.block_size, t.type_size)),
            _ => None,
        };
        assert_eq!(size(0), Some((1, 4)));
        assert_eq!(size(12), Some((256, 144)));
        assert_eq!(size(14), Some((256, 210)));
        assert_eq!(size(39), Some((32, 17)));
        for removed in [4, 5, 31, 32, 33, 36, 37, 38] {
            assert!(matches!(ggml_type(removed), TypeLookup::Removed(_)));
        }
        assert!(matches!(ggml_type(43), TypeLookup::Unknown));
    }

    #[test]
    fn names_in_messages_are_escaped_and_short() {
        assert_eq!(shown("a\nb"), "a\\nb");
        assert_eq!(shown(&"x".repeat(100)).chars().count(), 81);
    }
}
