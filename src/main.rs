fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // cmpl as its own chat templates' renderer: a child process bounded in
    // memory and time (cmpl_core::sandbox).
    if args.get(1).is_some_and(|a| a == cmpl::sandbox::CHILD_ARG) {
        std::process::exit(cmpl::sandbox::child(args.get(2).map(|a| a.as_os_str())));
    }
    if let Ok(me) = std::env::current_exe() {
        cmpl::sandbox::enable(me);
    }
    std::process::exit(cmpl::app::main(args));
}
