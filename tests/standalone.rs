//! The repository stands alone: no file in it reads or names a folder
//! outside it (a clone has nothing beside it). `.ci/run` proves the rest by
//! running the suite from a copy alone in an empty temporary folder.

use std::path::Path;

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if name == ".git" || name == "target" {
            continue;
        }
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn nothing_names_a_folder_beside_the_repository() {
    // Built at run time so that this file does not name them itself.
    let parent = ["..", "/"].concat();
    let needles = [
        format!("{parent}shared"),
        ["shared", "/spec"].concat(),
        ["completions.openapi", ".yaml"].concat(),
        ["NOTES", ".md"].concat(),
    ];
    let mut all = Vec::new();
    files(Path::new(env!("CARGO_MANIFEST_DIR")), &mut all);
    assert!(all.len() > 20, "walked the tree");
    for path in all {
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        for needle in &needles {
            assert!(
                !text.contains(needle.as_str()),
                "{} names {needle:?}, outside the repository",
                path.display()
            );
        }
    }
}
