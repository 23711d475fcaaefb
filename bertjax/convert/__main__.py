"""`python -m bertjax.convert`: converts a checkpoint between bertjax, Hugging Face and TF."""

from absl import app, flags, logging

from bertjax import cli, convert

flags.DEFINE_enum("from", "bertjax", convert.FORMATS, "Format of --input.")
flags.DEFINE_enum("to", "bertjax", convert.FORMATS, "Format of --output.")
flags.DEFINE_string("input", None, "Checkpoint directory (or TF checkpoint prefix) to read.",
                    required=True)
flags.DEFINE_string("output", None, "Directory to write.", required=True)
flags.DEFINE_bool("overwrite", False, "Replace --output if it exists.")
flags.DEFINE_integer("seed", 0, "Seed for the parts the input lacks (e.g. pretraining heads).")
flags.DEFINE_bool("quiet", False, "No progress lines; warnings and errors only.")
flags.DEFINE_bool("strict", False, "Refuse a checkpoint with tensors bertjax has no place for "
                  "(task heads) instead of leaving them out and listing them.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    # Orbax logs every step of a save at INFO; the progress lines here say what matters.
    logging.set_verbosity(logging.WARNING)
    with cli.one_line_errors("bertjax.convert"):
        convert.convert(FLAGS.input, FLAGS.output, src=FLAGS["from"].value, dst=FLAGS.to,
                        seed=FLAGS.seed, overwrite=FLAGS.overwrite, strict=FLAGS.strict,
                        log=(lambda line: None) if FLAGS.quiet else print)


if __name__ == "__main__":
    app.run(main)
