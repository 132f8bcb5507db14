from services.prefill_node.main import main

raise SystemExit(main())
