"""``python -m doctor`` is the same program as the ``k26-doctor`` console script."""

from doctor.cli import main

if __name__ == "__main__":
    main()
