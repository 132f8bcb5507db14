import sys

from services.cache_store.main import main

sys.exit(main())
