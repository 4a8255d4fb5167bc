fn main() {
    std::process::exit(cmpl::app::main(std::env::args_os().collect()));
}
