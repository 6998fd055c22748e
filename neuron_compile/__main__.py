import sys

from neuron_compile.cli import main

sys.exit(main())
