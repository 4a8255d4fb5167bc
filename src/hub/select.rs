//! Which file of a repository a `:QUANT` tag (or none) means, as llama.cpp
//! picks it: the tag matched case-insensitively; without one Q4_K_M, then
//! Q8_0, then the first GGUF. A split GGUF is its shards, first shard first.

/// Why no file fits.
#[derive(Debug, PartialEq, Eq)]
pub enum Missing {
    NoGguf,
    /// No GGUF for the tag; the quants the repository has.
    NoQuant(Vec<String>),
    /// The listing lacks shard `.0` of the split `.1`.
    Shard(String, String),
}

const PREFERRED: [&str; 2] = ["q4_k_m", "q8_0"];

/// The files to fetch for `quant` among a repository's `files` (their paths
/// in the repository): the model first, then its other shards.
pub fn choose(files: &[String], quant: Option<&str>) -> Result<Vec<String>, Missing> {
    let models: Vec<&String> = files
        .iter()
        .filter(|f| is_gguf(f) && !is_projector(f) && split_of(f).is_none_or(|(k, _)| k == 1))
        .collect();
    if models.is_empty() {
        return Err(Missing::NoGguf);
    }
    let pick = match quant {
        Some(tag) => models.iter().find(|f| has_tag(f, tag)),
        None => PREFERRED
            .iter()
            .find_map(|tag| models.iter().find(|f| has_tag(f, tag)))
            .or(models.first()),
    };
    let Some(first) = pick else {
        let mut quants: Vec<String> = models.iter().filter_map(|f| quant_of(f)).collect();
        quants.sort();
        quants.dedup();
        return Err(Missing::NoQuant(quants));
    };
    let Some((_, count)) = split_of(first) else {
        return Ok(vec![first.to_string()]);
    };
    let prefix = &first[..first.len() - SPLIT_SUFFIX_LEN];
    (1..=count)
        .map(|k| {
            let shard = format!("{prefix}-{k:05}-of-{count:05}.gguf");
            if files.contains(&shard) {
                Ok(shard)
            } else {
                Err(Missing::Shard(shard, first.to_string()))
            }
        })
        .collect()
}

/// The quant a file name carries (`Q4_K_M`, `IQ4_XS`, `F16`), as written.
pub fn quant_of(file: &str) -> Option<String> {
    stem(file)
        .split(['-', '.', '/'])
        .rev()
        .find(|t| {
            let t = t.to_ascii_lowercase();
            let t = t.strip_prefix('i').unwrap_or(&t);
            ["f16", "bf16", "f32", "f64"].contains(&t)
                || t.strip_prefix('q')
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// `tag` appears in `file` as a whole word: `q4_k` does not match `Q4_K_M`,
/// nor `q4_xs` `IQ4_XS`.
fn has_tag(file: &str, tag: &str) -> bool {
    let (file, tag) = (file.to_ascii_lowercase(), tag.to_ascii_lowercase());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    !tag.is_empty()
        && file.match_indices(&tag).any(|(at, _)| {
            !word(file[..at].chars().next_back()) && !word(file[at + tag.len()..].chars().next())
        })
}

fn is_gguf(file: &str) -> bool {
    file.to_ascii_lowercase().ends_with(".gguf")
}

/// Multimodal projectors ship beside models but are not models.
fn is_projector(file: &str) -> bool {
    file.rsplit('/')
        .next()
        .is_some_and(|name| name.to_ascii_lowercase().contains("mmproj"))
}

/// `-00001-of-00003.gguf`: llama.cpp's split naming.
const SPLIT_SUFFIX_LEN: usize = "-00001-of-00003.gguf".len();

/// (shard number, shard count) of a split GGUF's file.
fn split_of(file: &str) -> Option<(u32, u32)> {
    let tail = file.get(file.len().checked_sub(SPLIT_SUFFIX_LEN)?..)?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    let (k, n) = (tail.get(1..6)?, tail.get(10..15)?);
    (tail.starts_with('-') && tail.get(6..10)? == "-of-" && digits(k) && digits(n))
        .then(|| (k.parse().ok(), n.parse().ok()))
        .and_then(|(k, n)| Some((k?, n?)))
        .filter(|&(k, n)| k >= 1 && k <= n)
}

/// The file name without its folder, `.gguf` and split suffix.
fn stem(file: &str) -> &str {
    let file = file.rsplit('/').next().unwrap_or(file);
    let end = if split_of(file).is_some() {
        file.len() - SPLIT_SUFFIX_LEN
    } else {
        file.len() - if is_gguf(file) { 5 } else { 0 }
    };
    &file[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn picks_as_llama_cpp_does() {
        let files = list(&[
            "README.md",
            "m-F16.gguf",
            "m-Q8_0.gguf",
            "m-Q4_K_M.gguf",
            "m-IQ4_XS.gguf",
            "mmproj-m-Q4_K_M.gguf",
        ]);
        assert_eq!(choose(&files, None), Ok(list(&["m-Q4_K_M.gguf"])));
        assert_eq!(choose(&files, Some("q8_0")), Ok(list(&["m-Q8_0.gguf"])));
        assert_eq!(choose(&files, Some("iq4_xs")), Ok(list(&["m-IQ4_XS.gguf"])));
        assert_eq!(
            choose(&files, Some("Q4_K")),
            Err(Missing::NoQuant(list(&["F16", "IQ4_XS", "Q4_K_M", "Q8_0"])))
        );
        assert_eq!(choose(&files[..2], None), Ok(list(&["m-F16.gguf"])));
        assert_eq!(
            choose(&list(&["m-Q8_0.gguf", "m-Q6_K.gguf"]), None),
            Ok(list(&["m-Q8_0.gguf"]))
        );
        assert_eq!(choose(&list(&["README.md"]), None), Err(Missing::NoGguf));
    }

    #[test]
    fn splits_are_fetched_whole() {
        let files = list(&[
            "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf",
            "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
            "m-Q8_0-00001-of-00002.gguf",
        ]);
        assert_eq!(
            choose(&files, None),
            Ok(list(&[
                "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
                "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf"
            ]))
        );
        assert_eq!(
            choose(&files, Some("Q8_0")),
            Err(Missing::Shard(
                "m-Q8_0-00002-of-00002.gguf".into(),
                "m-Q8_0-00001-of-00002.gguf".into()
            ))
        );
        assert_eq!(
            quant_of("Q4_K_M/m-Q4_K_M-00001-of-00002.gguf").as_deref(),
            Some("Q4_K_M")
        );
        assert_eq!(
            quant_of("gemma-3-270m-it-UD-Q4_K_XL.gguf").as_deref(),
            Some("Q4_K_XL")
        );
        assert_eq!(quant_of("model.gguf"), None);
    }
}
