"""`python -m gpumemdoctor`."""
from gpumemdoctor.cli import main

if __name__ == "__main__":
    main()
